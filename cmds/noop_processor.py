"""A processor that completes every item at once: for measuring feedproc's own overhead."""

from feedproc import Item, Processor, Response


class Noop(Processor):
    async def process(self, item: Item) -> Response:
        return Response(done=True)
