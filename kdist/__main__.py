import sys

from kdist.cli import main

sys.exit(main())
