"""Measurement harness (spec §8): ``samu bench``, ``samu gate`` and ``samu report``.

``shapes`` names the shape sets, ``timing`` is the one timing/memory/launch path, ``scopes``
builds what a timed call does, ``peers`` the third-party builds, ``runner`` runs a bench,
``records`` writes and reads the JSON records, ``report`` renders REPORT.md and its figures,
``cli`` holds the argparse commands. The gates live in ``samu.gates``.
"""
