"""The program: it seeds numpy, then builds the loader generator through the helper."""

import numpy as np

from loaders import make_generator


def main(seed=0):
    np.random.seed(seed)
    return make_generator()


if __name__ == "__main__":
    main()
