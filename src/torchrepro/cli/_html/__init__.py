"""``report.html``: the one-file HTML report of ``check``, ``diff``, ``compare``, ``bisect``; ``env diff`` and
``audit`` with ``--html``.

Built from the same result objects and words as the terminal output (:mod:`torchrepro.cli._render`); self-contained
(inline CSS, inline SVG plots drawn here, a few lines of vanilla JavaScript to sort tables; no network reference),
readable without colour and printed, light and dark. Every recorded string goes through :func:`page.esc`.
"""
