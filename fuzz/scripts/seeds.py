#!/usr/bin/env python3
"""Turns what examples/capture.rs recorded (and objects read from a sandbox) into seed inputs
for each fuzz target, in the format each target's body expects (docs/security.md, "Fuzzing").

    fuzz/scripts/seeds.py CAPTURE_DIR OBJECTS_DIR OUT_DIR

CAPTURE_DIR: conn-*.bin, admission-*.json, extender-*.json; OBJECTS_DIR: upper-pods.json,
lower-pods.json, *-nodes.json, *-leases.json (kubectl get -o json), lower-token.txt.
"""
import base64, glob, hashlib, json, os, re, sys

cap, objs, out = sys.argv[1:4]

def put(target, data, name=None):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    name = name or hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)

def heads(conn):
    """(head, rest) of each request of a connection; after an upgrade, rest is the stream."""
    while True:
        end = conn.find(b'\r\n\r\n')
        if end < 0:
            return
        head, conn = conn[:end + 4], conn[end + 4:]
        lines = head.decode('latin1').split('\r\n')
        hdrs = {}
        for l in lines[1:]:
            if ':' in l:
                k, v = l.split(':', 1)
                hdrs.setdefault(k.strip().lower(), []).append(v.strip())
        if 'upgrade' in hdrs:
            yield head, lines[0], hdrs, conn
            return
        length = int(hdrs.get('content-length', ['0'])[0])
        yield head, lines[0], hdrs, b''
        conn = conn[length:]

VERSIONS = ['channel.k8s.io', 'v2.channel.k8s.io', 'v3.channel.k8s.io', 'v4.channel.k8s.io',
            'v5.channel.k8s.io']

def offered(hdrs, name):
    return [t.strip() for v in hdrs.get(name, []) for t in v.split(',') if t.strip()]

def bits(path):
    q = path.split('?', 1)[1] if '?' in path else ''
    flags = dict(kv.split('=', 1) for kv in q.split('&') if '=' in kv)
    on = lambda *ks: any(flags.get(k) in ('1', 'true') for k in ks)
    return (1 if on('input', 'stdin') else 0) | (2 if on('output', 'stdout') else 0) | \
        (4 if on('error', 'stderr') else 0) | (8 if on('tty') else 0)

for f in sorted(glob.glob(os.path.join(cap, 'conn-*.bin'))):
    conn = open(f, 'rb').read()
    for head, line, hdrs, rest in heads(conn):
        put('kubelet_router', head)
        path = line.split(' ')[1] if ' ' in line else ''
        kind = 2 if 'portForward' in path or 'portforward' in path else \
            1 if '/attach' in path else 0
        up = ','.join(hdrs.get('upgrade', [])).lower()
        if not rest:
            continue
        if 'spdy' in up:
            version = next((VERSIONS.index(o) for o in offered(hdrs, 'x-stream-protocol-version')
                            if o in VERSIONS), 0)
            put('spdy_streams', bytes([kind + (version << 2), bits(path)]) + rest)
            put('spdy_frames', bytes([7]) + rest)
            put('spdy_frames', bytes([0]) + rest[:600])
        elif 'websocket' in up:
            protos = offered(hdrs, 'sec-websocket-protocol')
            if kind == 2:
                tunnel = any('portforward' in p for p in protos)
                wkind = 3 if tunnel else 2
                put('websocket_streams', bytes([wkind, 16]) + rest)
            else:
                version = next((VERSIONS.index(p) for p in protos if p in VERSIONS), 0)
                put('websocket_streams', bytes([kind + (version << 3), bits(path)]) + rest)
            put('websocket_frames', bytes([2]) + rest)
        for m in re.finditer(rb'\{"Width":\d+,"Height":\d+\}', rest):
            put('resize', bytes([5]) + m.group(0) * 2)

for f in sorted(glob.glob(os.path.join(cap, 'admission-*.json'))):
    put('admission_review', open(f, 'rb').read())

verbs = {'filter': 0, 'prioritize': 1, 'bind': 2}
bodies = {}
for f in sorted(glob.glob(os.path.join(cap, 'extender-*.json'))):
    verb = os.path.basename(f).split('-')[1]
    body = open(f, 'rb').read()
    bodies.setdefault(verb, []).append(body)
    put('extender_args', bytes([verbs[verb]]) + body)
if bodies.get('filter') and bodies.get('bind'):
    put('extender_args', bytes([0]) + bodies['filter'][0] + b'\0' + bytes([1]) +
        bodies['prioritize'][0] + b'\0' + bytes([2]) + bodies['bind'][0])

def items(name):
    p = os.path.join(objs, name)
    return json.load(open(p))['items'] if os.path.exists(p) else []

for pod in items('upper-pods.json') + items('lower-pods.json'):
    a = pod['metadata'].get('annotations') or {}
    if 'clusterSelector' in a:
        put('cluster_selector', a['clusterSelector'])
    if 'tripped-labels' in a:
        put('annotations', b'\0' + a['tripped-labels'].encode())
    if 'tensile-kube.io/synced-annotations' in a:
        put('annotations', b'\1' + a['tensile-kube.io/synced-annotations'].encode())
    for c in pod['spec'].get('containers', []) + pod['spec'].get('initContainers', []):
        for kind in ('requests', 'limits'):
            for q in ((c.get('resources') or {}).get(kind) or {}).values():
                put('quantity', q)
for node in items('upper-nodes.json') + items('lower-nodes.json'):
    for kind in ('capacity', 'allocatable'):
        for q in (node['status'].get(kind) or {}).values():
            put('quantity', q)
for lease in items('upper-leases.json') + items('lower-leases.json'):
    holder = lease['spec'].get('holderIdentity')
    if holder:
        put('annotations', b'\5' + holder.encode())
token = os.path.join(objs, 'lower-token.txt')
if os.path.exists(token):
    payload = open(token).read().strip().split('.')[1]
    put('annotations', b'\6' + base64.urlsafe_b64decode(payload + '=' * (-len(payload) % 4)))

# Header blocks as they are before compression: the SPDY captures' SYN_STREAM/SYN_REPLY/HEADERS
# blocks inflated with the dictionary of crates/kubelet/src/spdy/dictionary.rs.
import struct, zlib
src = open(os.path.join(os.path.dirname(__file__), '../../crates/kubelet/src/spdy/dictionary.rs')).read()
entries = re.findall(r'^    "([^"]*)",$', src.split('const ENTRIES')[1].split('];')[0], re.M)
tail = ''.join(re.findall(r'"([^"]*)"', src.split('const TAIL: &str = concat!(')[1].split(');')[0]))
DICT = b''.join(struct.pack('>I', len(e)) + e.encode() for e in entries) + tail.encode()
assert len(DICT) == 1423, len(DICT)
for f in sorted(glob.glob(os.path.join(out, 'spdy_streams', '*'))):
    wire = open(f, 'rb').read()[2:]
    z = zlib.decompressobj(zdict=DICT)
    while len(wire) >= 8:
        w0, w1 = struct.unpack('>II', wire[:8])
        n = w1 & 0xffffff
        payload, wire = wire[8:8 + n], wire[8 + n:]
        if w0 & 0x80000000 and (w0 & 0xffff) in (1, 2, 8):
            skip = 10 if (w0 & 0xffff) == 1 else 4
            try:
                put('spdy_header_block', z.decompress(payload[skip:]))
            except zlib.error:
                break

# What real traffic of today's clients does not send: the older WebSocket channel protocols
# (v1 to v4, base64), the channel variant of port-forward, and texts only we write.
def ws_frame(payload, opcode=2, fin=True, mask=b'\x01\x02\x03\x04'):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack('>H', n)
    else:
        head += bytes([0x80 | 127]) + struct.pack('>Q', n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

stdin = ws_frame(b'\0hello\n') + ws_frame(b'\x04{"Width":80,"Height":24}') + \
    ws_frame(b'\xff\0') + ws_frame(b'', 9) + ws_frame(b'\x03\xe8', 8)
b64 = ws_frame(b'0aGVsbG8K', 1) + ws_frame(b'4eyJXaWR0aCI6ODAsIkhlaWdodCI6MjR9', 1) + \
    ws_frame(b'\x03\xe8', 8)
for version in range(5):
    put('websocket_streams', bytes([0 + (version << 3), 1 | 2 | 8]) + stdin)
    put('websocket_streams', bytes([0 + 4 + (version << 3), 1 | 2 | 4]) + b64)
put('websocket_streams', bytes([1 + (3 << 3), 3]) + stdin)
pf = ws_frame(b'\0\x90\x1fping') + ws_frame(b'\2\x82\x23pong') + ws_frame(b'\x03\xe8', 8)
put('websocket_streams', bytes([2, 16]) + pf)
put('websocket_streams', bytes([2 + 4, 0]) + ws_frame(b'0kB9waW5n', 1))
put('websocket_frames', bytes([0]) + stdin)
put('websocket_frames', bytes([1]) + b64)
put('websocket_frames', bytes([2]) + ws_frame(b'\0frag', fin=False) + ws_frame(b'ment', 0))

for text in [b'{"Width":80,"Height":24}\n{"Width":120,"Height":40}',
             b' {"Height":1,"Width":2}  {"Width":65535,"Height":0}', b'{"Width":-1,"Height":24}']:
    put('resize', bytes([3]) + text)

for head in [b'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n',
             b'DELETE /pods HTTP/1.1\r\nHost: x\r\n\r\n',
             b'GET /configz HTTP/1.1\r\nAuthorization: bearer  t0k \r\n\r\n',
             b'GET /exec/ns/pod/uid/c?command=sh&stdin=true&tty=true HTTP/1.1\r\n'
             b'Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n'
             b'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n'
             b'Sec-WebSocket-Protocol: v4.base64.channel.k8s.io, v4.channel.k8s.io\r\n\r\n',
             b'GET /portForward/ns/pod?port=80,8080&port=9090 HTTP/1.1\r\n'
             b'Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n'
             b'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n'
             b'Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n']:
    put('kubelet_router', head)

put('annotations', b'\x02' + b'3')
put('annotations', b'\x03' + b'vk-lower-1, vk-lower-2,,')
put('annotations', b'\x04' + b'vk-lower-1=2026-12-06T18:30:00Z\nvk-lower-2=not a time')
put('annotations', b'\x07' + json.dumps({
    "namespace": "default", "name": "web-1", "uid": "u1", "node": "vk-lower-1",
    "attempts": 2, "why": "Unschedulable", "how": {"throughOwner": {"controller": "rs-uid"}}}).encode())
put('cluster_selector', b'null')
put('cluster_selector', json.dumps({"nodeSelector": {"a": "<b&>"}, "affinity": {
    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}},
    "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute",
                     "tolerationSeconds": 30}]}).encode())
for q in ['1.5e3', '0.1m', '-2Ki', '100n', '9223372036854775807', '12E', '1e-9', '+.5']:
    put('quantity', q)
