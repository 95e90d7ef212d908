"""Benchmarks of the daemon, each a module run as ``python -m bench.<name>``.

End to end, against the C clients ``idealsub`` (the reference consumer), ``mosquitto_sub``,
``qos1pub`` and the outside clock ``mqttrelay`` (``relay``):
    e2e        the daemon against idealsub and mosquitto_sub on the same confirmed backlog
    backlog    a confirmed backlog queued for a daemon, drained and timed (used by the others)
    mapping    the default path against a device stream through its preset
    sparkplug  Sparkplug B against JSON over the same readings
    publish    ``loadgen publish`` against qos1pub
    soak       one daemon writing to MongoDB under a steady load for minutes
    outage     memory during a MongoDB outage
In process:
    receive    the MQTT receive and acknowledgement path per message
    acks       the source's acknowledgement bookkeeping per message
    encode     the write side per reading: plan() and BSON encoding
    jsonparse  the json format's parse of LoRaWAN uplinks, compiled twin against Python
    profile    where the daemon's CPU goes (py-spy over a drain into ``fakemongo``)
    api        the read API's latency per query, both layouts
    promql     a day of avg_over_time over a fleet: bucket statistics, raw readings, time series
Shared by api and promql:
    fleet      the fleet-day of readings, its database (the emulator, or a MongoDB given)
    stored     the fleet's documents as the writers store them, inserted in bulk
"""
