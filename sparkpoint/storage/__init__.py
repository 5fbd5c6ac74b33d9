"""Checkpoint storage (DESIGN.md §5, docs/checkpoint-format.md).

    fs                  StorageFS: the few fsspec operations checkpoints need (atomic, exclusive)
    layout              JobLayout: where things live under <checkpoint-dir>/<job>/
    objectstore         exclusive create on S3 (If-None-Match) and friends
    metadata            the `_metadata` format: encode / decode + verify
    handles             the file entries inside state handles
    ids                 DurableCheckpointIDCounter
    lease               JobLease (+ LeaseKeeper): one run per job, fencing tokens
    checkpoint_storage  FsCheckpointStorage, open_job_storage
    gc                  startup cleanup of crashed runs' leftovers
    inspect             list / verify / doctor
"""
