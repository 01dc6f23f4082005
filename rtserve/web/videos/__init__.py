"""Generated video: ``/v1/videos`` jobs on a SQLite job store, ``POST /v1/videos/sync`` and
``WS /v1/realtime/video`` (fragmented MP4 while generating), on the video engine
(docs/serving.md#videos)."""
