"""What is said about a rewrite after it is made: the doctor, the HTML page, step times, Grappler's output.

Internal: nothing here is part of the public API (that is :mod:`amp_rewrite`'s
face); modules may move between releases.

- :mod:`~amp_rewrite.report.doctor`: why a rewritten graph may not run faster;
- :mod:`~amp_rewrite.report.islands`: float32 islands between half ops and the Casts they cost;
- :mod:`~amp_rewrite.report.html`: the self-contained HTML report (its page in ``template/``);
- :mod:`~amp_rewrite.report.layout`: the layered drawing of the graph that report shows;
- :mod:`~amp_rewrite.report.measure`: step time of float32 and the rewrite, on this machine;
- :mod:`~amp_rewrite.report.grappler`: TensorFlow's own Grappler pass, run for comparison.
"""
