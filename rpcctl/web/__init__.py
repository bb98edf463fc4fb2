"""rpcctl's web page: a run (or a bench result) as one self-contained HTML file, or live.

    run directory ──rpcctl.inspect + rpcctl.records.runs──▶ snapshot (plain data, data.py)
                                                      │
                         figures.py (Plotly figure specs) + tables.py (escaped HTML tables)
                                                      │
              page.py: one HTML document, plotly.js inlined ──▶ ``rpcctl report -o FILE``
              server.py: the same page on 127.0.0.1, polling /api/view ──▶ ``rpcctl web``, ``launch --web``

Charts are drawn by plotly.js, which the ``plotly`` Python package ships (``pip install
'rpcctl[report]'``); rpcctl lays out the RRef picture itself, in rows (``figures``). Everything
that came from a rank or a file (names, errors, log text) is escaped before it reaches HTML.
The package is named ``web`` and not ``report`` because ``rpcctl.report`` is the loss API.
"""
