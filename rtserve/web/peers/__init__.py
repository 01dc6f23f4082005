"""Front-ends among their peers: a session stays in the front-end that admitted it (its runner,
output buffer and replay journal live in that process), and a client whose resume lands on
another front-end (another ``--workers`` process on the shared port, another host behind a
load balancer) is relayed to the owner, frame for frame, for the rest of that socket.

The owner is named in the session id itself (``owner.py``), so finding it costs no registry
write per session: the directory only maps each front-end to where its peers reach it
(``directory.py``: a socket folder on one host, a Ray actor in a cluster). Each front-end
serves its peers on a private site (``site.py``): the realtime routes and the drain route,
over a Unix socket in a 0700 folder or over TCP with signed requests (``signing.py``).
"""

from rtserve.web.peers.directory import Directory, PeerAddress, SocketDirectory
from rtserve.web.peers.owner import new_front_end_tag, owner_of
from rtserve.web.peers.relay import Origin, Peers, RelayOutcome

__all__ = [
    "Directory",
    "Origin",
    "PeerAddress",
    "Peers",
    "RelayOutcome",
    "SocketDirectory",
    "new_front_end_tag",
    "owner_of",
]
