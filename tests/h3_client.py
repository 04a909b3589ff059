"""An HTTP/3 client for tests/http3.rs, on aioquic (PyPI): sends the requests given as JSON
([[method, path, body], ...]) on one QUIC connection, concurrently when asked, and prints the
answers as JSON ([{status, headers, body_len, body}]). The server's certificate is not verified
(the test's is self-signed); the SNI is the third argument. benches/h3_load.py drives `Client`."""
import asyncio
import json
import ssl
import sys

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}
        self.answers = {}

    def quic_event_received(self, event):
        for ev in self.h3.handle_event(event):
            answer = self.answers.setdefault(ev.stream_id, {"headers": [], "body": b""})
            if isinstance(ev, HeadersReceived):
                answer["headers"] += ev.headers
            elif isinstance(ev, DataReceived):
                answer["body"] += ev.data
            if getattr(ev, "stream_ended", False) and ev.stream_id in self.waiting:
                self.waiting.pop(ev.stream_id).set_result(self.answers.pop(ev.stream_id))

    async def request(self, method, authority, path, body):
        sid = self._quic.get_next_available_stream_id()
        headers = [(b":method", method.encode()), (b":scheme", b"https"),
                   (b":authority", authority.encode()), (b":path", path.encode())]
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        self.h3.send_headers(sid, headers, end_stream=not body)
        if body:
            self.h3.send_data(sid, body, end_stream=True)
        done = asyncio.get_running_loop().create_future()
        self.waiting[sid] = done
        self.transmit()
        return await asyncio.wait_for(done, 20)


def shown(answer):
    headers = {k.decode(): v.decode() for k, v in answer["headers"]}
    body = answer["body"]
    return {"status": int(headers.get(":status", "0")), "headers": headers, "body_len": len(body),
            "body": body[:1 << 20].decode(errors="replace")}


async def main(host, port, sni, requests, parallel):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=sni)
    config.verify_mode = ssl.CERT_NONE
    async with connect(host, port, configuration=config, create_protocol=Client) as client:
        calls = [client.request(m, sni, p, b.encode() if isinstance(b, str) else b"x" * b) for m, p, b in requests]
        if parallel:
            answers = await asyncio.gather(*calls)
        else:
            answers = [await c for c in calls]
        print(json.dumps([shown(a) for a in answers]))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), len(sys.argv) > 5))
