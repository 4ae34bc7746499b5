"""Module-level tools for the executor tests (a sandboxed tool is imported by its child)."""
import time


def echo(x):
  return f"echo {x}"


def boom(x):
  raise ZeroDivisionError(f"boom {x}")


def sleepy(x):
  time.sleep(float(x))
  return "slept"


def spin(x):
  while True:
    pass


def hog(x):
  return str(len(bytearray(2 * 1024 ** 3)))


def big(x):
  return "z" * (10 * 2 ** 20)


def bad_utf8(x):
  return b"ab\xff\xfecd"
