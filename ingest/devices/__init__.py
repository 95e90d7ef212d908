"""What devices publish, read into readings: the default format, rules, formats, presets.

``decode`` is the default format; ``rules`` reads mapping files and presets (``presets/``)
into rules, ``mapping`` applies them (one compiled topic matcher, then a format from
``formats/`` per payload); ``sparkplug_state`` and ``homie_state`` keep the state of the
stateful formats, backed by MongoDB; ``check`` shows what one message becomes;
``discover/`` proposes rules for a broker's traffic. The hot parts of ``decode`` and
``mapping`` are written once, in ``_decode_py`` and ``_mapping_py``, which setup.py also
compiles (as ``_decode_c`` and ``_mapping_c``, typed by their ``.pxd``). Pure apart from
the stateful formats' store: may import ``ingest.model``, ``ingest.errors``, ``ingest.retry`` and
``ingest.store``; never the settings, the metrics, the broker side, the pipeline or the
API (``discover`` may import the settings: it connects to a broker itself).
"""
