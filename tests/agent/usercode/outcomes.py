"""A script that ends as asked, for the script-mode tests: python outcomes.py crash|talk."""

import sys

if sys.argv[1] == "crash":
    raise RuntimeError("the script crashed on purpose")
for line in range(5):
    print("line", line)
