import sys
from pathlib import Path

# The program's modules import as `components.*`, as they do under `pulumi up`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
