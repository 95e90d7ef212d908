"""What devices publish, read into readings: the default format, rules, formats, presets.

``decode`` is the default format; ``rules`` reads mapping files and presets (``presets/``)
into rules, ``mapping`` applies them (one compiled topic matcher, then a format from
``formats/`` per payload); ``sparkplug_state`` and ``homie_state`` keep the state of the
stateful formats, backed by MongoDB; ``check`` shows what one message becomes;
``discover/`` proposes rules for a broker's traffic. Pure apart from the stateful
formats' store: may import ``ingest.model``, ``ingest.errors``, ``ingest.retry`` and
``ingest.store``; never the settings, the metrics, the broker side, the pipeline or the
API (``discover`` may import the settings: it connects to a broker itself).
"""
