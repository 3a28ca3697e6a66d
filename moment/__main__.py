import sys

from moment.cli import main

sys.exit(main())
