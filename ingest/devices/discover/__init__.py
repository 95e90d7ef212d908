"""``ingest discover``: listen to a broker, then propose mapping rules for what it heard.

``command`` captures and checks; ``patterns`` groups the captured topics and tells
housekeeping apart, ``onevalue`` proposes one rule for a tree of one-value-per-topic JSON,
``propose`` completes each group with what conventions (``conventions``: Home Assistant
discovery, Homie), payloads (``identity``: device ids, device lists; ``selection``:
readings and housekeeping told apart by a type field) and names (``units``) say,
``shadowing`` keeps the proposal clear of the presets it recommends, ``proposal`` writes
the rules as text, in the syntax the mapping accepts (``language`` probes it). May
import the rest of ``ingest.devices`` and ``ingest.config``; nothing above.
"""
