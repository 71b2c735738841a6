"""What the client, the registry and the broker share, below all three (tests/test_layers.py):

    BodyError, Fields, parse_body     smartgo.common.bodies      (JSON request bodies, every field checked)
    parse_properties, parse_flag      smartgo.common.properties  (key=value bodies, true/false settings)
    PersistedFile, RecordFile         smartgo.common.persist     (atomically rewritten JSON files)
    parse_heartbeat, SubscriptionData smartgo.common.heartbeat   (HeartbeatData, as clients send it)
    sign, signer, AccessConfig        smartgo.common.acl_sign    (what a client of an ACL node needs)
    AclValidator, load_acl            smartgo.common.acl_check   (what a node checks requests with)
    AclGuard                          smartgo.common.acl_guard   (the ACL check in front of processors)

It imports only the basics (config, accel, cpus) and the net, store and filter layers.
"""
