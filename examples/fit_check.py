"""Shared by the decomposition examples: compare per-iteration fits with a numpy reference."""


def report_fits(fits, reference, tolerance: float = 1e-8) -> int:
    """Print both fit series side by side; 0 if they agree within ``tolerance``, else 1."""
    print("  iter  fit (deinsum)       fit (numpy)")
    for k, (mine, ref) in enumerate(zip(fits, reference)):
        print(f"  {k + 1:>4}  {mine:.12f}  {ref:.12f}")
    error = max(abs(a - b) for a, b in zip(fits, reference))
    status = 0 if error <= tolerance else 1
    print(f"max |fit - numpy fit| = {error:.2e}: {'OK' if status == 0 else 'MISMATCH'}")
    return status
