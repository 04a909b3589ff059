"""HTTP/3 load for benches/http3.sh, on aioquic: CONNS connections, each keeping STREAMS requests
in flight, for SECONDS; prints "requests p50_ms p99_ms errors". Python and aioquic cap what one
process can send (a few thousand requests per second on this machine): compare servers by the
CPU they spend per request, which the script around it measures, more than by req/s."""
import asyncio
import os
import ssl
import sys
import time

from aioquic.asyncio import connect
from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from h3_client import Client  # noqa: E402 - the tests' HTTP/3 client, one protocol class for both


async def get(client, authority, path):
    answer = await client.request("GET", authority, path, b"")
    return dict(answer["headers"]).get(b":status")


async def worker(client, sni, path, until, lat, errors):
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            status = await get(client, sni, path)
            if status != b"200":
                errors.append(status)
        except Exception as e:  # noqa: BLE001 - counted, the run goes on
            errors.append(str(e))
            continue
        lat.append(time.monotonic() - t0)


async def conn(host, port, sni, path, streams, until, lat, errors):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=sni)
    config.verify_mode = ssl.CERT_NONE
    async with connect(host, port, configuration=config, create_protocol=Client) as client:
        await asyncio.gather(*[worker(client, sni, path, until, lat, errors) for _ in range(streams)])


async def main(host, port, sni, path, conns, streams, seconds):
    lat, errors = [], []
    until = time.monotonic() + seconds
    await asyncio.gather(*[conn(host, port, sni, path, streams, until, lat, errors) for _ in range(conns)])
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0.0  # noqa: E731
    print(f"{len(lat)} {pick(0.5):.2f} {pick(0.99):.2f} {len(errors)}")


asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]),
                 float(sys.argv[7])))
