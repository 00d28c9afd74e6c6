import sys

from tests.support.simserver.main import main

raise SystemExit(main(sys.argv))
