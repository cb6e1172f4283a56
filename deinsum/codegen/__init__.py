"""Emitted mpi4py programs and the standalone runtime pieces they carry."""
