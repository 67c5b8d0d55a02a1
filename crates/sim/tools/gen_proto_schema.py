#!/usr/bin/env python3
"""Generates crates/sim/src/apiserver/proto_schema.rs: the field table the API server's protobuf
decoder (apiserver/protobuf.rs) walks to turn `application/vnd.kubernetes.protobuf` bodies into
the JSON a client would have sent.

Three sources are joined, message by message and field by field:

* k8s-pb (kube-rs' prost bindings, cargo registry): field tags and wire types.
* k8s-openapi (cargo registry): the JSON field names, from the serde code of the same types
  (v1_33 first, the API surface the server serves; later versions only for fields added since).
  Fields are joined on normalised names (lowercase, no underscores: `pod_i_ps` = `podIPs`).
* tools/k8s_go_fields.tsv, extracted once from the Go types (k8s.io/api and
  k8s.io/apimachinery, see `extract-go`): which fields are pointers, `omitempty` or `,inline`.
  The prost bindings cannot tell: Go's protobuf encoder always writes non-pointer fields, even
  empty ones, while Go's JSON encoder drops zero `omitempty` values, so the decoder must drop a
  zero scalar exactly when the Go field is a non-pointer `omitempty` one.

Anything that cannot be joined is printed and the script exits 1: it never guesses.

Usage:
    python3 crates/sim/tools/gen_proto_schema.py            # write proto_schema.rs
    python3 crates/sim/tools/gen_proto_schema.py --check    # exit 1 if it is out of date
    python3 crates/sim/tools/gen_proto_schema.py extract-go --api DIR --apimachinery DIR \\
        --label v0.33.2                                     # rewrite k8s_go_fields.tsv

The Go facts were extracted from k8s.io/api and k8s.io/apimachinery at tag v0.33.2 (the API
surface k8s-openapi's v1_33 describes; v0.33.13 gives the same facts, API types do not change
within a minor): check both out at that tag (or take them from Go's module cache) and pass
their roots.
Regenerating proto_schema.rs needs only the cargo registry (`cargo fetch`) and the facts file.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.dirname(HERE)
OUTPUT = os.path.join(CRATE, "src", "apiserver", "proto_schema.rs")
FACTS = os.path.join(HERE, "k8s_go_fields.tsv")

K8S_PB = "k8s-pb-0.9.0"
K8S_OPENAPI = "k8s-openapi-0.29.0"
# The served API surface first; later versions only name fields k8s-pb has and v1_33 lacks.
OPENAPI_VERSIONS = ["v1_33", "v1_34", "v1_35", "v1_36", "v1_37"]

# Proto packages of the groups the server serves (and rbac/autoscaling, which kubectl sends),
# with the Go directories (relative to k8s.io/api or k8s.io/apimachinery) they come from.
API_PACKAGES = [
    "core/v1", "apps/v1", "batch/v1", "discovery/v1", "events/v1", "coordination/v1",
    "storage/v1", "scheduling/v1", "policy/v1", "admissionregistration/v1",
    "authentication/v1", "authorization/v1", "rbac/v1", "autoscaling/v1", "autoscaling/v2",
]
MACHINERY_PACKAGES = ["pkg/apis/meta/v1", "pkg/runtime", "pkg/api/resource", "pkg/util/intstr"]

# The kinds kubectl sends as protobuf (its typed clients do; files, patches and the dynamic
# client send JSON or YAML): the objects of `kubectl create <generator>`, `run` and `expose`,
# `create token`, the evictions of `drain`, the reviews of `auth can-i` and `auth whoami`, the
# Scale of `scale`, and DeleteOptions (in any group version). Only the messages these reach
# are in the table: the simulated API server serves the sandbox, and nothing else sends it
# protobuf (kube-rs, helm and the simulated kubelet speak JSON).
ROOT_KINDS = {
    ("v1", "ConfigMap"), ("v1", "Namespace"), ("v1", "Pod"), ("v1", "ResourceQuota"),
    ("v1", "Secret"), ("v1", "Service"), ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"), ("batch/v1", "CronJob"), ("batch/v1", "Job"),
    ("policy/v1", "Eviction"), ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("scheduling.k8s.io/v1", "PriorityClass"), ("authentication.k8s.io/v1", "TokenRequest"),
    ("authentication.k8s.io/v1", "SelfSubjectReview"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"), ("autoscaling/v1", "Scale"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
}
ALWAYS = ["k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions"]

# Messages whose JSON form is a scalar: the decoder has a rule for each, not a field list.
SPECIAL = {
    "k8s.io.apimachinery.pkg.api.resource.Quantity": "Quantity",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Time": "Time",
    "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime": "MicroTime",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Duration": "Duration",
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": "IntOrString",
    "k8s.io.apimachinery.pkg.runtime.RawExtension": "RawExtension",
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1": "FieldsV1",
    # Go named slice types (`type ExtraValue []string`): a message wrapping `repeated string
    # items = 1` on the wire, a plain array of strings in JSON.
    "k8s.io.api.authentication.v1.ExtraValue": "StrList",
    "k8s.io.api.authorization.v1.ExtraValue": "StrList",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Verbs": "StrList",
}

SCALARS = {"string": "Str", "bool": "Bool", "int32": "I32", "int64": "I64", "double": "F64",
           "bytes": "Bytes"}


def die(lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)
    sys.exit(1)


def registry_crate(name: str) -> str:
    found = sorted(glob.glob(os.path.expanduser(f"~/.cargo/registry/src/*/{name}")))
    if not found:
        die([f"{name} is not in the cargo registry: run `cargo fetch` in the workspace first"])
    return found[-1]


def norm(name: str) -> str:
    return name.removeprefix("r#").replace("_", "").lower()


# ---------------------------------------------------------------------------------------------
# k8s-pb: messages, tags, wire types.

@dataclass
class PbField:
    rust: str
    tag: int
    kind: str  # a SCALARS key, "message" or "map"
    repeated: bool
    ref: str | None = None  # message (or map value message) full name
    map_value: str | None = None  # map value: a SCALARS key or "message"


@dataclass
class PbMessage:
    package: str
    rust: str
    fields: list[PbField] = field(default_factory=list)
    full: str = ""  # proto full name, from the join


def pb_package(module: list[str]) -> str:
    return "k8s.io." + ".".join(module)


PROST_ATTR = re.compile(r"#\[prost\((.*)\)\]")
TYPE_PATH = re.compile(r"(?<![:\w])((?:super::)*(?:[a-z_][a-z0-9_]*::)*[A-Z]\w*)")
STD_TYPES = {"Option", "Vec", "String", "BTreeMap", "Box"}


def parse_pb_file(path: str, module: list[str]) -> list[PbMessage]:
    messages = []
    current: PbMessage | None = None
    attr: str | None = None
    pending = ""
    for line in open(path, encoding="utf-8"):
        s = line.strip()
        if s.startswith("///") or s.startswith("//"):
            continue
        m = re.match(r"pub struct (\w+) \{", s)
        if m:
            current = PbMessage(pb_package(module), m.group(1))
            messages.append(current)
            continue
        if current is None:
            continue
        if s == "}" and attr is None:
            current = None
            continue
        m = PROST_ATTR.match(s)
        if m:
            attr = m.group(1)
            pending = ""
            continue
        if attr is not None:
            pending += s
            if not pending.endswith(",") or pending.count("<") != pending.count(">"):
                continue
            fm = re.match(r"pub ((?:r#)?\w+):\s*(.*),$", pending)
            if not fm:
                die([f"{path}: cannot parse field {pending!r}"])
            current.fields.append(pb_field(path, module, attr, fm.group(1), fm.group(2)))
            attr = None
    return messages


def resolve_path(module: list[str], path: str) -> tuple[str, str]:
    parts = path.split("::")
    mod = list(module)
    while parts and parts[0] == "super":
        mod.pop()
        parts.pop(0)
    return pb_package(mod + parts[:-1]), parts[-1]


def pb_field(path: str, module: list[str], attr: str, rust: str, ty: str) -> PbField:
    tag = int(re.search(r'tag = "(\d+)"', attr).group(1))
    head = attr.split(",")[0].strip()
    refs = [p for p in TYPE_PATH.findall(ty) if p.split("::")[-1] not in STD_TYPES]
    if head.startswith("btree_map"):
        key, value = re.search(r'btree_map = "(\w+), (\w+)"', attr).groups()
        if key != "string":
            die([f"{path}: {rust}: map key {key} is not supported"])
        f = PbField(rust, tag, "map", False, map_value=value)
        if value == "message":
            f.ref = "%s\x00%s" % resolve_path(module, refs[-1])
        return f
    kind = head.split(" ")[0]
    repeated = "repeated" in attr
    if kind == "message":
        return PbField(rust, tag, "message", repeated, ref="%s\x00%s" % resolve_path(module, refs[-1]))
    if kind not in SCALARS:
        die([f"{path}: {rust}: wire kind {kind} is not supported"])
    return PbField(rust, tag, kind, repeated)


def load_pb(root: str) -> dict[tuple[str, str], PbMessage]:
    out = {}
    for path in glob.glob(os.path.join(root, "src", "**", "mod.rs"), recursive=True):
        module = os.path.relpath(os.path.dirname(path), os.path.join(root, "src")).split(os.sep)
        for m in parse_pb_file(path, module):
            out[(m.package, m.rust.lower())] = m
    return out


# ---------------------------------------------------------------------------------------------
# k8s-openapi: definition names, JSON field names, kinds.

@dataclass
class OaType:
    definition: str  # io.k8s.api.core.v1.Pod
    fields: dict[str, str]  # normalised -> JSON name
    api_version: str | None
    kind: str | None


def load_openapi(root: str, version: str) -> dict[tuple[str, str], OaType]:
    out = {}
    base = os.path.join(root, "src", version)
    for path in glob.glob(os.path.join(base, "**", "*.rs"), recursive=True):
        text = open(path, encoding="utf-8").read()
        m = re.match(r"// Generated from definition (\S+)", text)
        if not m:
            continue
        definition = m.group(1)
        sm = re.search(r"^pub struct (\w+)", text, re.M)
        if not sm:
            continue
        fields = {}
        for json_name, _rust in re.findall(r'"([^"]+)" => Field::Key_(\w+),', text):
            fields[norm(json_name)] = json_name
        av = re.search(r'const API_VERSION: &\'static str = "([^"]*)";', text)
        kind = re.search(r'const KIND: &\'static str = "([^"]*)";', text)
        package = "k8s.io." + definition.removeprefix("io.k8s.").rsplit(".", 1)[0]
        out[(package, sm.group(1).lower())] = OaType(
            definition, fields, av.group(1) if av else None, kind.group(1) if kind else None)
    return out


# ---------------------------------------------------------------------------------------------
# Go facts: pointer / omitempty / inline, keyed by proto message and tag.

GO_FIELD = re.compile(
    r"^\s*(?:(\w+)\s+)?(\*?[\w.\[\]*]+)\s+`([^`]*)`")


def extract_go(args: argparse.Namespace) -> None:
    rows = []
    dirs = [(args.api, p) for p in API_PACKAGES] + [(args.apimachinery, p)
                                                     for p in MACHINERY_PACKAGES]
    for base, rel in dirs:
        d = os.path.join(base, rel)
        proto = open(os.path.join(d, "generated.proto"), encoding="utf-8").read()
        package = re.search(r"^package ([\w.]+);", proto, re.M).group(1)
        for path in sorted(glob.glob(os.path.join(d, "*.go"))):
            name = os.path.basename(path)
            if name.endswith("_test.go") or name.startswith("zz_generated") or \
                    name.endswith(".pb.go"):
                continue
            rows += go_struct_rows(path, package)
    rows.sort(key=lambda r: (r[0], int(r[1])))
    with open(FACTS, "w", encoding="utf-8") as out:
        out.write(f"# Go struct facts of the protobuf fields, from k8s.io/api and "
                  f"k8s.io/apimachinery {args.label}.\n")
        out.write("# Written by `gen_proto_schema.py extract-go`; read by gen_proto_schema.py.\n")
        out.write("# message\ttag\tjson\tflags (ptr: Go pointer, omitempty, inline)\n")
        for r in rows:
            out.write("\t".join(r) + "\n")
    print(f"wrote {len(rows)} fields to {FACTS}")


def go_struct_rows(path: str, package: str) -> list[tuple[str, ...]]:
    rows = []
    struct = None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^type (\w+) struct \{", line)
        if m:
            struct = m.group(1)
            continue
        if struct and line.startswith("}"):
            struct = None
            continue
        if not struct or line.lstrip().startswith("//"):
            continue
        m = GO_FIELD.match(line)
        if not m or 'protobuf:"' not in m.group(3):
            continue
        gotype, tags = m.group(2), m.group(3)
        pb = re.search(r'protobuf:"([^"]*)"', tags).group(1).split(",")
        if len(pb) < 2:
            continue  # `protobuf:"-"`: not on the wire
        js = re.search(r'json:"([^"]*)"', tags)
        js_parts = js.group(1).split(",") if js else [""]
        flags = []
        if gotype.startswith("*"):
            flags.append("ptr")
        if "omitempty" in js_parts[1:]:
            flags.append("omitempty")
        if "inline" in js_parts[1:]:
            flags.append("inline")
        rows.append((f"{package}.{struct}", pb[1], js_parts[0], ",".join(flags) or "-"))
    return rows


@dataclass
class GoFact:
    json: str
    flags: set[str]


def load_facts() -> tuple[dict[tuple[str, int], GoFact], str]:
    facts = {}
    label = ""
    for line in open(FACTS, encoding="utf-8"):
        if line.startswith("#"):
            label = label or line.strip("# \n")
            continue
        message, tag, json_name, flags = line.rstrip("\n").split("\t")
        facts[(message, int(tag))] = GoFact(json_name, set(flags.split(",")) - {"-"})
    return facts, label


# ---------------------------------------------------------------------------------------------
# The join.

@dataclass
class OutField:
    tag: int
    json: str
    ctor: str  # one / omit0 / rep / inline
    kind: str  # Rust Kind expression


def kind_expr(ref_full: str | None, scalar: str | None) -> str:
    if scalar is not None:
        return SCALARS[scalar]
    assert ref_full is not None
    if ref_full in SPECIAL:
        return SPECIAL[ref_full]
    return f'Msg("{ref_full}")'


def generate(check: bool) -> None:
    pb_root = registry_crate(K8S_PB)
    oa_root = registry_crate(K8S_OPENAPI)
    pb = load_pb(pb_root)
    oa = [load_openapi(oa_root, v) for v in OPENAPI_VERSIONS]
    facts, facts_label = load_facts()
    wanted = {"k8s.io.api." + p.replace("/", ".") for p in API_PACKAGES} | {
        "k8s.io.apimachinery." + p.replace("/", ".") for p in MACHINERY_PACKAGES}
    go_names = {(m.rsplit(".", 1)[0], m.rsplit(".", 1)[1].lower()): m for m, _ in facts}

    errors: list[str] = []
    notes: list[str] = []

    def openapi_of(key) -> list[OaType]:
        return [o[key] for o in oa if key in o]

    # Proto full names are the Go type names: from the k8s-openapi definition names, or for
    # types only ever inlined (no definition of their own) from the Go facts.
    for key, m in pb.items():
        types = openapi_of(key)
        if types:
            m.full = "k8s.io." + types[0].definition.removeprefix("io.k8s.")
        else:
            m.full = go_names.get(key, f"{m.package}.{m.rust}")
    by_full = {m.full: m for m in pb.values()}

    def ref_full(ref: str) -> str:
        package, rust = ref.split("\x00")
        target = pb.get((package, rust.lower()))
        if target is None:
            errors.append(f"reference to unknown message {package}.{rust}")
            return f"{package}.{rust}"
        return target.full

    for full, kind in SPECIAL.items():
        if kind == "StrList":
            m = by_full.get(full)
            shape = [(f.tag, f.rust, f.kind, f.repeated) for f in m.fields] if m else None
            if shape != [(1, "items", "string", True)]:
                errors.append(f"{full}: expected a list wrapper (repeated string items = 1), "
                              f"k8s-pb has {shape}")

    def is_inline(full: str, f: PbField) -> bool:
        fact = facts.get((full, f.tag))
        return bool(fact and "inline" in fact.flags and f.kind == "message" and not f.repeated)

    def flat_names(full: str) -> list[str]:
        """Normalised JSON names of a message, with Go-inlined messages expanded."""
        m = by_full[full]
        names = []
        for f in m.fields:
            if is_inline(full, f):
                names += flat_names(ref_full(f.ref))
            else:
                names.append(norm(f.rust))
        return names

    # Closure: every message of the wanted packages that k8s-openapi knows, and what they use.
    todo = sorted(m.full for k, m in pb.items()
                  if m.package in wanted and openapi_of(k) and m.full not in SPECIAL)
    skipped = sorted(m.full for k, m in pb.items()
                     if m.package in wanted and not openapi_of(k) and m.full not in SPECIAL)
    # A message only ever inlined has no k8s-openapi type: its fields are named by the types it
    # is inlined into (which have them flattened).
    inline_context: dict[str, list[OaType]] = {}
    seen: set[str] = set()
    out: dict[str, list[OutField]] = {}
    stats = {"fields": 0, "later": 0, "omit0": 0, "inline": 0, "nofacts": 0}
    while todo:
        full = todo.pop()
        if full in seen or full in SPECIAL:
            continue
        m = by_full.get(full)
        if m is None:
            errors.append(f"{full}: no such message in k8s-pb")
            continue
        types = openapi_of((m.package, m.rust.lower())) or inline_context.get(full, [])
        if not types:
            # Maybe it is inlined by a message still to be processed: come back to it then.
            if any(full == ref_full(f.ref) for x in todo for f in by_full[x].fields
                   if x in by_full and f.ref and is_inline(x, f)):
                todo.insert(0, full)
                continue
            errors.append(f"{full}: referenced, but k8s-openapi has no type for it")
            seen.add(full)
            continue
        seen.add(full)
        fields = []
        for f in sorted(m.fields, key=lambda f: f.tag):
            fact = facts.get((full, f.tag))
            ref = ref_full(f.ref) if f.ref else None
            if ref and ref not in SPECIAL and ref not in seen:
                todo.append(ref)
            if is_inline(full, f):
                known = {n for t in types for n in t.fields}
                missing = [n for n in flat_names(ref) if n not in known]
                if missing:
                    errors.append(f"{full}.{f.rust} (tag {f.tag}): Go inlines {ref}, but "
                                  f"{types[0].definition} lacks its fields {missing}")
                    continue
                inner = by_full[ref]
                if not openapi_of((inner.package, inner.rust.lower())):
                    inline_context.setdefault(ref, []).extend(types)
                fields.append(OutField(f.tag, "", "inline", kind_expr(ref, None)))
                stats["inline"] += 1
                continue
            json_name = None
            for i, t in enumerate(types):
                if norm(f.rust) in t.fields:
                    json_name = t.fields[norm(f.rust)]
                    if i > 0 and t.definition == types[0].definition:
                        stats["later"] += 1
                        notes.append(f"note: {full}.{json_name}: added after v1_33, named by "
                                     f"k8s-openapi {OPENAPI_VERSIONS[i]}")
                    break
            if json_name is None:
                errors.append(f"{full}.{f.rust} (tag {f.tag}): no JSON name in "
                              f"{types[0].definition} (normalised {norm(f.rust)!r})")
                continue
            if fact and fact.json != json_name:
                errors.append(f"{full}.{f.rust} (tag {f.tag}): k8s-openapi says {json_name!r}, "
                              f"Go says {fact.json!r}")
                continue
            if fact is None:
                stats["nofacts"] += 1
                notes.append(f"note: {full}.{json_name}: not in the Go facts (newer than "
                             f"them), so its zero values are kept")
            if f.kind == "map":
                value = kind_expr(ref, None) if f.map_value == "message" \
                    else SCALARS[f.map_value]
                fields.append(OutField(f.tag, json_name, "one", f"Map(&{value})"))
            elif f.repeated:
                fields.append(OutField(f.tag, json_name, "rep",
                                       kind_expr(ref, None if ref else f.kind)))
            elif f.kind == "message":
                fields.append(OutField(f.tag, json_name, "one", kind_expr(ref, None)))
            else:
                # A Go non-pointer `omitempty` scalar is always on the wire but left out of
                # the JSON when it is the zero value.
                zero_omitted = fact is not None and "omitempty" in fact.flags \
                    and "ptr" not in fact.flags
                stats["omit0"] += zero_omitted
                fields.append(OutField(f.tag, json_name, "omit0" if zero_omitted else "one",
                                       SCALARS[f.kind]))
            stats["fields"] += 1
        out[full] = fields

    # Go fields (1.33) that k8s-pb no longer has would be skipped as unknown: list them.
    for (message, tag), fact in sorted(facts.items()):
        m = by_full.get(message)
        if message in out and m and not any(f.tag == tag for f in m.fields):
            notes.append(f"note: {message} tag {tag} ({fact.json}) is in Go 1.33 but not in "
                         f"{K8S_PB}; it is skipped as unknown")

    roots = []
    for full in sorted(out):
        m = by_full[full]
        for t in openapi_of((m.package, m.rust.lower()))[:1]:
            if t.kind and t.api_version is not None and (t.api_version, t.kind) in ROOT_KINDS:
                roots.append((t.api_version, t.kind, full))
    roots.sort()
    missing = ROOT_KINDS - {(av, k) for av, k, _ in roots}
    if missing:
        errors.append(f"kinds of ROOT_KINDS without a message: {sorted(missing)}")
    # Only what the roots reach.
    reached: set[str] = set()
    stack = [full for _, _, full in roots] + ALWAYS
    while stack:
        full = stack.pop()
        if full in reached or full not in out:
            continue
        reached.add(full)
        for f in out[full]:
            stack.extend(re.findall(r'Msg\("([^"]+)"\)', f.kind))
    out = {k: v for k, v in out.items() if k in reached}

    if errors:
        die(["gen_proto_schema: cannot join these fields; nothing was written:"]
            + ["  " + e for e in sorted(set(errors))])

    text = render(out, roots, facts_label)
    if check:
        current = open(OUTPUT, encoding="utf-8").read() if os.path.exists(OUTPUT) else ""
        if current != text:
            die([f"{OUTPUT} is out of date: run python3 crates/sim/tools/gen_proto_schema.py"])
        print("proto_schema.rs is up to date")
        return
    with open(OUTPUT, "w", encoding="utf-8") as f:
        f.write(text)
    for n in sorted(set(notes)):
        print(n)
    skipped = [s for s in skipped if s not in out]
    print(f"messages of these packages without a k8s-openapi type, left out: {len(skipped)}")
    for s in skipped:
        print(f"  {s}")
    print(f"wrote {OUTPUT}: {len(out)} messages, {stats['fields'] + stats['inline']} fields "
          f"({stats['inline']} inline, {stats['omit0']} zero-omitted scalars, "
          f"{stats['later']} named from k8s-openapi > v1_33, {stats['nofacts']} without Go "
          f"facts), {len(roots)} kinds")


def render(out: dict[str, list[OutField]], roots: list[tuple[str, str, str]],
           facts_label: str) -> str:
    lines = [
        f"// @generated by crates/sim/tools/gen_proto_schema.py from {K8S_PB}, {K8S_OPENAPI}",
        "// and tools/k8s_go_fields.tsv. Do not edit; regenerate with",
        "//     python3 crates/sim/tools/gen_proto_schema.py",
        "//! The protobuf field table of the Kubernetes types the API server decodes.",
        "",
        "use super::protobuf::{Field as F, Kind::*, Message as M, Root};",
        "",
        "/// Every message, sorted by full name (the decoder binary-searches it).",
        "#[rustfmt::skip]",
        "pub(super) static MESSAGES: &[M] = &[",
    ]
    for full in sorted(out):
        lines.append(f'M::new("{full}", &[')
        for f in out[full]:
            if f.ctor == "inline":
                lines.append(f"    F::inline({f.tag}, {f.kind}),")
            else:
                lines.append(f'    F::{f.ctor}({f.tag}, "{f.json}", {f.kind}),')
        lines.append("]),")
    lines.append("];")
    lines.append("")
    lines.append("/// The root message of each kind, sorted by apiVersion and kind.")
    lines.append("#[rustfmt::skip]")
    lines.append("pub(super) static ROOTS: &[Root] = &[")
    for av, kind, full in roots:
        lines.append(f'    Root::new("{av}", "{kind}", "{full}"),')
    lines.append("];")
    # The header's first lines are plain comments, so the module doc comes after them; rustfmt
    # accepts `//!` only before items, which it is.
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    ex = sub.add_parser("extract-go", help="rewrite k8s_go_fields.tsv from Go sources")
    ex.add_argument("--api", required=True, help="a checkout of k8s.io/api")
    ex.add_argument("--apimachinery", required=True, help="a checkout of k8s.io/apimachinery")
    ex.add_argument("--label", required=True, help="their version, for the file's header")
    parser.add_argument("--check", action="store_true", help="only check the output is current")
    args = parser.parse_args()
    if args.cmd == "extract-go":
        extract_go(args)
    else:
        generate(args.check)


if __name__ == "__main__":
    main()
