"""Stop strings over a growing text, for the offline API and the server alike."""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: list[str], include_in_output: bool):
        self.stops = stops
        self.include = include_in_output

    def find(self, text: str, before: int) -> tuple[int, str] | None:
        """The first stop string found in text since `before` (where the newest piece began):
        (where the text is cut, the stop string), or None."""
        for s in self.stops:
            i = text.find(s, max(0, before - len(s) + 1))
            if i >= 0:
                return (i + len(s) if self.include else i), s
        return None

    def partial_len(self, text: str) -> int:
        """How much of the text's end could still begin a stop string (held back while streaming)."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
