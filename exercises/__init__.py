"""Exercises that check themselves.

Each auto-checked exercise of the book has a file to edit under ``exercises/partN/`` (a Triton kernel, a CUDA
kernel or a Python function, with ``# YOUR CODE HERE`` where the work goes), a reference solution under
``exercises/solutions/`` and at least one planted wrong solution under ``exercises/planted/``, and a check:

    python -m snippets exercise list
    python -m snippets exercise show part4.softmax.7
    python -m snippets exercise check part4.softmax.7              # your file
    python -m snippets exercise check part4.softmax.7 --solution   # the reference solution
    python -m snippets exercise check part4.softmax.7 --planted no_max

``exercises.engine`` runs a check, ``exercises.catalog`` lists the exercises and their checks,
``exercises.cuda`` compiles and runs CUDA exercises (``exercises/emu/cuda_emu.h``: a CPU emulator for them).
"""
