import sys

from moment.entry import run

sys.exit(run())
