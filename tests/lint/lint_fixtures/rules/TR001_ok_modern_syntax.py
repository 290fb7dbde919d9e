"""Near miss for TR001: newer syntax that parses fine."""


def pick(command):
    match command.split():  # ok
        case ["go", direction]:
            return direction
        case _:
            return None


if (n := len("abc")) > 2:  # ok
    print(f"{n=}")
