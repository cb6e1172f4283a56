"""The run-time wing: what runs on the ranks (exchange, kernels, checks, the script driver), numpy + mpi4py only.

Emitted scripts carry these modules; the planner never imports them.
"""
