import sys
from pathlib import Path

TESTS = Path(__file__).parent
sys.path[:0] = [str(TESTS), str(TESTS / "workers")]
