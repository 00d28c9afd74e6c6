import sys

from tests.support.simserver.server import main

raise SystemExit(main(sys.argv))
