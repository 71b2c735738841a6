"""Access control on the server side: the node's ACL guard from its settings, and the plain_acl.yml edits the
ACL admin requests make (the signing and checking shared with clients is smartgo.common)."""
