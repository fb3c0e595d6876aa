"""Scripts that end in every way script mode must handle: python outcomes.py MODE."""

import sys
import time

mode = sys.argv[1]
if mode == "usage":
    print("usage: outcomes.py needs a real argument", file=sys.stderr)
    sys.exit(2)
if mode == "crash":
    raise RuntimeError("the script crashed on purpose")
if mode == "talk":
    for line in range(5):
        print("line", line)
    sys.exit(0)
if mode == "hang":
    time.sleep(3600)
