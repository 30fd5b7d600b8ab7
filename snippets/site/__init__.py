"""Render benchmark tables and plots into the chapters, from the committed results (used by the MkDocs hook).

A chapter asks for them with HTML comments on a line of their own, so the raw Markdown stays readable:

    <!-- bench:table vector_add -->              headline size, one table per GPU with results
    <!-- bench:table warp_divergence sizes=all -->  every measured size as a pivot (sizes x versions), folded
                                                 in a collapsible block (fold=no: open, where the sweep is
                                                 the lesson and no plot shows it)
    <!-- bench:table softmax dtype=bfloat16 -->  another timed dtype than the first (any table or plot)
    <!-- bench:table capstone_train memory-apart=v3 -->  versions whose extra-memory cell is not comparable
                                                 (memory kept between calls, as a CUDA graph's pool)
    <!-- bench:headline layernorm -->            one sentence per GPU: the best book version and the best
                                                 library version at the headline (a chapter's summary box)
    <!-- bench:plot vector_add -->               the sweep: rate against size, one line per implementation
    <!-- bench:plot cpu_vs_gpu y=ms -->          time instead of rate (log scale)
    <!-- bench:summary -->                       every op of the book, one row per op and GPU
    <!-- bench:ceilings -->                      the ceilings measured on each GPU
    <!-- bench:export rmsnorm rmsnorm_fwd_bwd --> a "Use it in your project" box: the command that writes a
                                                 self-contained copy of each op's best book version
                                                 (python -m snippets export, snippets.export)
    <!-- bench:output device_query -->           a program's output captured on each GPU (outputs/<gpu>/NAME.txt)
    <!-- bench:ladder sgemm -->                  each version's % of the ceiling, one bar per version and size
    <!-- bench:roofline -->                      every op's best result on the roofline of each GPU
    <!-- bench:timeline stream_overlap -->       a timeline drawn from a trace captured on each GPU
                                                 (outputs/<gpu>/NAME.json)
    <!-- bench:sweep autotune_matmul -->         a sweep of launch configurations captured on each GPU
                                                 (outputs/<gpu>/NAME.json, written by scripts/capture_autotune.py):
                                                 a heatmap over BLOCK_M x BLOCK_N and a table of every config
    <!-- bench:versus vector_add:v5,vector_add:v4 reduce_sum:v7,reduce_sum:v8 -->
                                                 versions of different languages side by side: lines of code
                                                 (snippets.bench.loc) and the headline rate, one row per
                                                 OP:VERSION (commas or spaces between them), each from the
                                                 latest GPU that measured the op. OP:VERSION@k1+k2 names the
                                                 __global__ kernels a CUDA version launches when its name and
                                                 its launcher do not tell them (see loc.launched_kernels)
    <!-- bench:goal rmsnorm_fwd_bwd v3 v1:1 v2:1 -->
                                                 a chapter's goal checked against the results, one row per term
                                                 and GPU: vK:R (at least R times as fast as version vK at the
                                                 headline), ceiling:F (at least F of the op's ceiling),
                                                 memory-vK:F (at most F times vK's peak memory beyond the
                                                 inputs), rate:X (at least X in the op's metric, e.g. TFLOP/s),
                                                 OP.vK:R or OP.best:R (at least R times another op's rate at
                                                 the same size on the same GPU);
                                                 dtype=D for another timed dtype, size=KEY for a
                                                 sweep size (its size key, e.g. size=k=4096,m=4096,n=4096).
                                                 Each row says met, not met, stale or not measured.
                                                 VERSION "best": the book's fastest version on each GPU

Every table carries its provenance in a footnote (gathered at the end of the page); a result whose source has
changed since it was measured is marked stale, and an op with no results says so instead of showing numbers.
A captured output (bench:output, bench:timeline, bench:sweep) is marked the same way when the code that produced
it has changed since (its record, NAME.meta.json, says which code: snippets.bench.captures), and "no provenance"
when it has no record.

The package: ``fmt`` (labels and numbers), ``tables``, ``figures`` (plots), ``goals``, ``sweep``, ``roofline``,
``timeline``, and ``page`` (the directive pattern and the dispatch table from kind to renderer).
"""

from snippets.registry import size_key
from snippets.site.figures import _pyplot, _series_keys, figure_svg, render_ladder, render_plot, style_axes
from snippets.site.fmt import _cname, _fmt_size, short_size
from snippets.site.goals import parse_goal, render_goal
from snippets.site.page import DIRECTIVE, RENDERERS, directives, render_page
from snippets.site.sweep import _resolve_hash, render_sweep
from snippets.site.tables import parse_versus, render_headline, render_summary, render_table, render_versus

__all__ = ["DIRECTIVE", "RENDERERS", "_cname", "_fmt_size", "_pyplot", "_resolve_hash", "_series_keys",
           "directives", "figure_svg", "parse_goal", "parse_versus", "render_goal", "render_headline",
           "render_ladder", "render_page", "render_plot", "render_summary", "render_sweep", "render_table",
           "render_versus", "short_size", "size_key", "style_axes"]
