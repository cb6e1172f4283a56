"""Shared by the decomposition examples: run a step of a planned sweep, report per-iteration traffic
and compare per-iteration fits with a numpy reference."""
from deinsum.sequence import reads_moved


def run_step(step, program, tensors: dict) -> tuple[int, bool]:
    """``tensors[step.output] = program(*inputs)`` for one step of a ``deinsum.SequencePlan``; returns the
    bytes this rank received and whether they equal the model with X read where it lives."""
    tensors[step.output] = program(*(tensors[name] for name in step.inputs))
    x_moved = reads_moved(step, program.last_plan, "X")
    return program.last_run.bytes_received, program.last_run.matches_model and not x_moved


def report_traffic(per_rank) -> int:
    """Print, per iteration, the bytes each rank received (max / min) and whether every call on every rank
    matched the model with X in place (``per_rank[r][k] = (bytes, exact)``); 0 if always, else 1."""
    print("  iter  received bytes per rank (max / min)  every call == model, X in place")
    status = 0
    for k in range(len(per_rank[0])):
        counts = [t[k][0] for t in per_rank]
        exact = all(t[k][1] for t in per_rank)
        print(f"  {k + 1:>4}  {max(counts):>12,} / {min(counts):<12,}           {exact}")
        status |= not exact
    return status


def report_fits(fits, reference, tolerance: float = 1e-8) -> int:
    """Print both fit series side by side; 0 if they agree within ``tolerance``, else 1."""
    print("  iter  fit (deinsum)       fit (numpy)")
    for k, (mine, ref) in enumerate(zip(fits, reference)):
        print(f"  {k + 1:>4}  {mine:.12f}  {ref:.12f}")
    error = max(abs(a - b) for a, b in zip(fits, reference))
    status = 0 if error <= tolerance else 1
    print(f"max |fit - numpy fit| = {error:.2e}: {'OK' if status == 0 else 'MISMATCH'}")
    return status
