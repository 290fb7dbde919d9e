import torch


def main(:  # expect: TR001
    pass
