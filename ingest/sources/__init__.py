"""Sources: where documents live (a web site, an S3-compatible bucket, a local folder).

A source reader (`SourceReader`) walks its source and says, for each document it finds,
whether it is new or changed (with its bytes), unchanged (by ETag, Last-Modified, size and
time, or content hash), or failed; what a complete walk did not find is gone. The readers fetch
only: parsing, ingest and deleting what is gone are the sync's (`ingest.sources.sync`), and
what a source knew of each document at its last run is kept in the store.
"""
