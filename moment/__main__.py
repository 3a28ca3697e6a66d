import sys

try:  # Ctrl-C while Python loads the command line: one line, as during the work
    from moment.cli import main
except KeyboardInterrupt:
    print("moment: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
