import sys

from detsample.cli import main

sys.exit(main())
