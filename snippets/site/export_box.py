"""``<!-- bench:export OP [OP ...] -->``: a chapter's "Use it in your project" box.

The box shows the command that copies an op's kernel out of the book (``python -m snippets export OP -o
mykernels``) and what it writes, worked out by :func:`snippets.export.plan` from the code and the committed
results, so it names the version the command really exports and the functions that file really holds::

    <!-- bench:export rmsnorm -->                 one op: the book's best version (the results decide)
    <!-- bench:export scale relu saxpy -->        several ops of one listing, one box
    <!-- bench:export rmsnorm out=layers -->      another folder in the command

An op whose export another op of the box already holds (``rmsnorm_fwd_bwd`` next to ``rmsnorm``, whose file
carries its training function) gets no command of its own. An op with no version of the book's own says that
there is nothing to export.
"""

from __future__ import annotations


def _code(name: str) -> str:
    return f"`{name}`"


def _series(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _bullets(p, out: str) -> list[str]:
    """What one op's export writes, a bullet per file (or folder)."""
    op, impl = p.op, p.targets[0].impl
    why = p.why.replace("the book's fastest version at the headline size on the ", "the fastest of the book's "
                        "versions on the ")
    parts = [f"{_code(p.function)} ({op.name} {p.version}, {impl.lang}: {impl.desc}; {why})"]
    for t in p.targets[1:]:
        parts.append(f"{_code(p.closure.names[t.root])} ({t.op.name} {t.version}: a training step's forward "
                     "and backward)")
    classes = [p.closure.names[d] for d in p.roots if d not in {t.root for t in p.targets}]
    text = "; ".join(parts)
    if classes:
        text += (" and " if len(parts) == 1 else "; ") + _series([_code(c) for c in classes]) + \
            ", the `torch.autograd.Function` to train with"
    needs = _series(p.needs)
    bullets = [f"- {_code(f'{out}/{op.name}.py')}: {text}. It needs {needs}."]
    if p.cuda_files:
        bullets.append(f"- {_code(f'{out}/csrc/')}: the CUDA C it loads "
                       f"({_series([_code(f.name) for f in p.cuda_files])}), compiled by CuPy at the first call.")
    if impl.device == "any":
        where = "on the GPU, else on the CPU through Triton's interpreter"
    elif impl.runs_on("cpu"):
        where = "on the CPU"
    else:
        where = "on an NVIDIA GPU (without one they skip, saying so)"
    bullets.append(f"- {_code(f'{out}/test_{op.name}.py')}: its tests against the op's reference on small "
                   f"sizes, {where}.")
    return bullets


def render_export_box(ops: list, results: dict, out: str = "mykernels") -> str:
    """The admonition for ``ops``: the commands, and for each the version it picks and why, the file's
    public names, the CUDA sources copied beside it, what it needs and its test file."""
    from snippets.export import ExportError, plan

    if not out or any(c.isspace() or c in "`'\"" for c in out):
        raise ValueError(f"bench:export: out= takes a plain folder name, got {out!r}")
    plans, notes = [], []
    for op in ops:
        try:
            plans.append(plan(op.name, None, results))
        except ExportError as e:
            notes.append(f"Nothing to export for {op.name}: {e}")
    held = {(d.module, d.name) for p in plans for d in p.roots[1:]}
    plans = [p for p in plans if (p.targets[0].root.module, p.targets[0].root.name) not in held]
    lines = ['!!! tip "Use it in your project"', ""]
    if plans:
        lines += ["    ```sh"] + [f"    python -m snippets export {p.op.name} -o {out}" for p in plans] + \
            ["    ```", ""]
        lines.append(f"    {'It writes' if len(plans) == 1 else 'They write'} one file per op that imports nothing "
                     "from this repository: the kernel and every helper it calls, copied from the book's code, "
                     "with its tests beside it.")
        lines.append("")
        for p in plans:
            lines += [f"    {b}" for b in _bullets(p, out)]
        lines.append("")
        lines.append(f"    `python -m pytest {out}` runs the tests; `python -m snippets export "
                     f"{plans[0].op.name} vN` exports another version.")
    for note in notes:
        lines += ["", f"    {note}"]
    return "\n".join(lines) + "\n"


def render(c) -> str:
    """The renderer ``snippets.site.page`` dispatches ``bench:export`` to."""
    if not c.pos:
        raise ValueError("bench:export names no op")
    unknown = [n for n in c.pos if n not in c.ops]
    if unknown:
        raise ValueError(f"bench:export names unknown ops {unknown}; known: {sorted(c.ops)}")
    return render_export_box([c.ops[n] for n in c.pos], c.results, c.kw.get("out", "mykernels"))
