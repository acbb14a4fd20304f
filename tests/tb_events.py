"""Reading tensorboard event files in tests (TFRecord framing, no tensorboard needed)."""

import struct
from pathlib import Path


def read_events(path: Path) -> list:
    """Every `Event` of a tensorboard events file."""
    from tensorboardX.proto.event_pb2 import Event

    data, out, i = Path(path).read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        out.append(Event.FromString(data[i + 12:i + 12 + n]))
        i += 12 + n + 4
    return out
