#!/usr/bin/env python3
"""Hand-made hostile inputs, one set per fuzz target, written to fuzz/regressions/<target>/
next to the inputs the fuzzer found (docs/security.md, "Fuzzing"). Each is an attack the
product must keep holding against: decompression bombs, length fields far past the bytes sent,
deep nesting, floods of names. Re-running rewrites them identically.

    fuzz/scripts/hostile.py
"""
import json, os, re, struct, zlib

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')

def put(target, name, data):
    d = os.path.join(root, 'regressions', target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)

src = open(os.path.join(root, '../crates/kubelet/src/spdy/dictionary.rs')).read()
entries = re.findall(r'^    "([^"]*)",$', src.split('const ENTRIES')[1].split('];')[0], re.M)
tail = ''.join(re.findall(r'"([^"]*)"', src.split('const TAIL: &str = concat!(')[1].split(');')[0]))
DICT = b''.join(struct.pack('>I', len(e)) + e.encode() for e in entries) + tail.encode()

def block(pairs):
    raw = struct.pack('>I', len(pairs))
    for n, v in pairs:
        raw += struct.pack('>I', len(n)) + n + struct.pack('>I', len(v)) + v
    return raw

def control(kind, flags, payload):
    return struct.pack('>HHI', 0x8003, kind, (flags << 24) | len(payload)) + payload

def syn_streams(blocks):
    """SYN_STREAM frames 1, 3, 5, ... with these raw blocks, compressed in one context."""
    z = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, DICT)
    out = b''
    for i, raw in enumerate(blocks):
        c = z.compress(raw) + z.flush(zlib.Z_SYNC_FLUSH)
        out += control(1, 0, struct.pack('>IIBB', 2 * i + 1, 0, 0, 0) + c)
    return out

data = lambda sid, payload, fin=0: struct.pack('>II', sid, (fin << 24) | len(payload)) + payload
exec_headers = lambda kind: block([(b'streamtype', kind)])

# A zlib bomb: 16 MiB of one value in a few KiB of frame.
bomb = syn_streams([block([(b'x', b'a' * (16 << 20))])])
# One name with many empty values (each value a pair with its own copy of the name).
nuls = syn_streams([block([(b'n' * 512, b'\0' * 4096)])])
# The header of a 16 MiB DATA frame, and nothing after it.
announced = data(1, b'')[:4] + struct.pack('>I', 0xffffff)
# Many streams opened and reset at once, pings, a SETTINGS flood, GOAWAY.
flood = syn_streams([exec_headers(b'stdin')] * 300) + b''.join(
    control(3, 0, struct.pack('>II', 2 * i + 1, 5)) for i in range(300)) + b''.join(
    control(6, 0, struct.pack('>I', 2 * i + 1)) for i in range(300)) + control(
    4, 0, struct.pack('>I', 1000) + b'\0' * 8000) + control(7, 0, struct.pack('>II', 1, 0))
# The same stream id opened twice, data for a stream never opened, a FIN twice.
confused = syn_streams([exec_headers(b'error'), exec_headers(b'stdin')]) + syn_streams(
    [exec_headers(b'stdout')]) + data(1, b'x') + data(99, b'nobody') + data(3, b'', 1) + data(
    3, b'late', 1)

for name, wire in [('zlib-bomb', bomb), ('nul-values', nuls), ('announced-16-mib', announced),
                   ('floods', flood), ('confused-streams', confused)]:
    put('spdy_frames', name, bytes([7]) + wire)
    put('spdy_streams', name, bytes([0 + (4 << 2), 1 | 2 | 4]) + wire)
put('spdy_streams', 'port-forward-pairs', bytes([2, 0]) + syn_streams(
    [block([(b'streamtype', t), (b'port', p), (b'requestid', r)]) for t, p, r in
     [(b'error', b'80', b'1'), (b'data', b'80', b'1'), (b'data', b'0', b'2'),
      (b'data', b'65536', b'3'), (b'error', b'80', b'')]]) + data(3, b'GET /'))
put('spdy_header_block', 'nul-values', block([(b'n' * 64, b'\0' * 600)]))
put('spdy_header_block', 'count-past-the-bytes', struct.pack('>I', 0xffffffff) + b'\0' * 8)
put('spdy_header_block', 'length-past-the-bytes', struct.pack('>II', 1, 0xfffffff0) + b'x')

def ws(payload, opcode=2, fin=True, length=None):
    n = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack('>H', n)
    else:
        head += bytes([0x80 | 127]) + struct.pack('>Q', n)
    mask = b'\x37\xfa\x21\x3d'
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

ws_cases = [
    ('length-2-to-the-63', ws(b'\0', length=(1 << 63) - 1)),
    ('past-the-message-limit', ws(b'\0' * 16, length=(16 << 20) + 1)),
    ('many-fragments', ws(b'\0' + b'a' * 100, fin=False) + b''.join(
        ws(b'a' * 10, opcode=0, fin=False) for _ in range(2000))),
    ('unmasked', b'\x82\x02\x00a'),
    ('long-ping', ws(b'p' * 200, opcode=9)),
    ('close-every-channel', b''.join(ws(bytes([255, c])) for c in range(256))),
    ('text-in-binary', ws(b'\xff\xfe', opcode=1)),
]
for name, wire in ws_cases:
    put('websocket_frames', name, bytes([2]) + wire)
    put('websocket_streams', name, bytes([0 + (4 << 3), 1 | 2 | 8]) + wire)
put('websocket_streams', 'base64-garbage', bytes([4 + (3 << 3), 1 | 2]) +
    ws(b'0!!!!', 1) + ws(b'4' + b'A' * 5000, 1) + ws(b'', 1))
put('websocket_streams', 'tunnel-of-a-zlib-bomb', bytes([3, 0]) + ws(bomb[:60000]) +
    ws(bomb[60000:]))

put('resize', 'unfinished-object', bytes([64]) + b'{"Width":' + b' ' * 6000)
put('resize', 'deep-nesting', bytes([1]) + b'[' * 5000)
put('resize', 'numbers-past-u16', bytes([3]) + b'{"Width":65536,"Height":1}{"Width":1,"Height":1}')

def head(line, headers=()):
    return (line + '\r\n' + ''.join(f'{k}: {v}\r\n' for k, v in headers) + '\r\n').encode()

upgrade = [('Connection', 'Upgrade'), ('Upgrade', 'SPDY/3.1')]
put('kubelet_router', 'many-slashes', head('GET /' + '/' * 8000 + 'exec HTTP/1.1'))
put('kubelet_router', 'ten-thousand-ports',
    head('POST /portForward/ns/p?port=' + ','.join(['80'] * 10000) + ' HTTP/1.1', upgrade +
         [('X-Stream-Protocol-Version', 'portforward.k8s.io')]))
put('kubelet_router', 'many-protocols',
    head('POST /exec/ns/p/c?command=sh&output=1 HTTP/1.1', upgrade +
         [('X-Stream-Protocol-Version', ','.join(['v9.channel.k8s.io'] * 2000))]))
put('kubelet_router', 'bad-flags-and-times',
    head('GET /containerLogs/ns/p/c?sinceTime=9999999-99&tailLines=-1&limitBytes=9e99&follow=yes'
         ' HTTP/1.1'))

pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"virtual-pod": "true"}},
       "spec": {"containers": [{"name": "c", "image": "i"}]}}
review = lambda obj, op='CREATE': json.dumps({
    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
    "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": op, "namespace": "ns", "object": obj}})
put('admission_review', 'deep-nesting', '{"request":' * 3000 + '1' + '}' * 3000)
put('admission_review', 'containers-of-braces',
    review({"spec": {"containers": [{}] * 3000}}))
put('admission_review', 'bad-cluster-selector', review(dict(pod, metadata=dict(
    pod["metadata"], annotations={"clusterSelector": "[1,2]"}))))
put('admission_review', 'not-a-pod', review(pod).replace('"kind": "Pod"', '"kind": "Secret"'))
put('admission_review', 'null-everywhere', review({"metadata": None, "spec": {
    "containers": [{"name": "c", "image": "i", "resources": None}], "affinity": None,
    "tolerations": None, "nodeSelector": None}}))

put('extender_args', 'thousands-of-names', b'\0' + json.dumps(
    {"Pod": pod, "NodeNames": ['vk-a', 'vk-b', 'worker'] * 1000}).encode())
put('extender_args', 'nodes-without-names', b'\1' + json.dumps(
    {"Pod": pod, "Nodes": {"Items": [{"metadata": {}}, {}, 1]}}).encode())
put('extender_args', 'long-names-then-bind', b'\0' + json.dumps(
    {"pod": pod, "nodenames": ['x' * 300]}).encode() + b'\0\2' + json.dumps(
    {"PodName": "p" * 300, "Node": "vk-a"}).encode() + b'\0\2' + json.dumps(
    {"podname": "p", "PODUID": "u", "node": "vk-a", "Node": 1}).encode())

put('cluster_selector', 'deep-nesting', '{"affinity":' * 2000 + '{}' + '}' * 2000)
put('cluster_selector', 'escapes', json.dumps(
    {"nodeSelector": {"\u2028<&>": "\u2029"}, "tolerations": None, "extra": [1e308]}))
put('cluster_selector', 'duplicate-members', '{"nodeSelector":{"a":"b"},"nodeSelector":null}')

put('annotations', 'token-times-at-the-edges', b'\6' + json.dumps(
    {"sub": "system:serviceaccount:a:b", "iat": 0, "exp": 253402300799}).encode())
put('annotations', 'tripped-labels-not-a-map', b'\0[["a","b"]]')
put('annotations', 'count-past-u32', b'\2' + b'9' * 40)
put('annotations', 'record-of-bad-times', b'\4' + b'\n'.join(
    [b'n%d=-9999-01-01T00:00:00Z' % i for i in range(200)]))

put('quantity', 'ten-thousand-digits', '1' * 10000)
put('quantity', 'exponent-past-i64', '1e99999999999999999999')
put('quantity', 'tiny-binary', '0.' + '0' * 60 + '1Ei')
put('quantity', 'signed-zero', '-0.0e-0')
