"""``ingest discover``: listen to a broker, then propose mapping rules for what it heard.

``command`` captures and checks; ``patterns`` groups the captured topics, ``propose``
completes each group with what conventions (``conventions``: Home Assistant discovery,
Homie) and payloads (``identity``: device ids, device lists) say, ``shadowing`` keeps the
proposal clear of the presets it recommends, ``proposal`` writes the rules as text. May
import the rest of ``ingest.devices`` and ``ingest.config``; nothing above.
"""
