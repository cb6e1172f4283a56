"""deinsum: communication-optimal distributed einsums."""
from .decompose import Decomposition, Step, decompose
from .errors import DeinsumError

__version__ = "0.1.0"
__all__ = ["DeinsumError", "Decomposition", "Step", "decompose", "__version__"]
