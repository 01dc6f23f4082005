"""Browser voice chat over WebRTC (aiortc): ``POST /v1/realtime/calls`` and ephemeral keys.

One module per job: ``offer`` (reading and checking the SDP offer), ``session_config`` (the
session a call opens with), ``ice`` (STUN/TURN and host candidates), ``audio_in`` /
``audio_out`` (the microphone into the session, the paced agent track out), ``channel``
(the ``oai-events`` data channel as the realtime connection's socket), ``projection`` and
``events`` (which events go on the channel and which play on the track), ``call`` (one
call's lifecycle), ``service`` (the calls of this process), ``client_secrets`` (short-lived
``ek_`` keys), ``metrics`` and ``routes``.
"""
