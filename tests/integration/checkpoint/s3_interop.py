#!/usr/bin/env python3
"""The boto3/botocore side of the S3 tests: a standard client, a SigV4 check, a checkpoint reader.

For tests/integration/checkpoint/s3_store_test.cpp and s3_checkpoint_test.cpp: a standard S3 client that reads
and writes the objects of our store, an independent SigV4 check of our signed requests, and an
independent reader of TrainFlow checkpoints (docs/checkpoints.md).

Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN; the endpoint
and bucket from the command line. Path-style addressing, region us-east-1 unless --region.

  s3_interop.py dump --endpoint URL --bucket B --prefix P --out-dir D
                       lists the keys under P (ListObjectsV2, paginated) and writes the i-th
                       object to D/i; prints "i<TAB>key" a line
  s3_interop.py put  --endpoint URL --bucket B --key K --in F [--key K2 --in F2 ...]
                       file F as object K (multipart in 5 MiB parts above 5 MiB, as boto3's
                       transfer manager does)
  s3_interop.py upload-dir --endpoint URL --bucket B --prefix P --dir D
                       every file under D as object P/<its path relative to D>; prints "uploaded N
                       files"
  s3_interop.py verify-manifest --endpoint URL --bucket B --prefix P [--page-size K]
                       lists P/ in pages of K keys; for every P/step-*/MANIFEST.json: checks its
                       checksum, format and step and that it lists every chunk of every tensor
                       once, then reads every object it lists and checks its size and xxh64 (a
                       pure-Python XXH64, sharing no code with the C library);
                       prints one line per checkpoint ("step-000000000010 full: 21 objects,
                       357312 bytes, ok") and "verified N checkpoints, M objects"
  s3_interop.py verify-sigv4 --requests F                           F: JSON list of captured
                       requests (s3_fault_proxy.py's /__proxy/captured); recomputes each
                       Authorization signature with botocore's S3SigV4Auth and checks the payload
                       hash against the body the proxy saw; prints "verified N requests"
Exits 0 on success, 1 with a message on stderr otherwise.
"""
import argparse
import json
import os
import re
import struct
import sys
import urllib.parse

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

AUTH_RE = re.compile(r"^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, "
                     r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$")
MANIFEST_RE = re.compile(r"^(step-(\d{12}))/MANIFEST\.json$")  # relative to the checkpoint root


# XXH64 (seed 0), from the algorithm's specification (xxhash.com, "xxHash fast digest algorithm").
XXH_P1, XXH_P2, XXH_P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
XXH_P4, XXH_P5, XXH_MASK = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5, (1 << 64) - 1


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & XXH_MASK


def _round(acc, lane):
    return (_rotl((acc + lane * XXH_P2) & XXH_MASK, 31) * XXH_P1) & XXH_MASK


def _merge(acc, v):
    return (((acc ^ _round(0, v)) * XXH_P1) + XXH_P4) & XXH_MASK


def xxh64(data):
    n, i = len(data), 0
    if n >= 32:
        v = [(XXH_P1 + XXH_P2) & XXH_MASK, XXH_P2, 0, (-XXH_P1) & XXH_MASK]
        stripes = n // 32
        lanes = struct.unpack_from("<%dQ" % (4 * stripes), data)
        for k in range(0, 4 * stripes, 4):
            v = [_round(v[0], lanes[k]), _round(v[1], lanes[k + 1]), _round(v[2], lanes[k + 2]),
                 _round(v[3], lanes[k + 3])]
        i = 32 * stripes
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & XXH_MASK
        for lane in v:
            h = _merge(h, lane)
    else:
        h = XXH_P5
    h = (h + n) & XXH_MASK
    while i + 8 <= n:
        h ^= _round(0, struct.unpack_from("<Q", data, i)[0])
        h = (_rotl(h, 27) * XXH_P1 + XXH_P4) & XXH_MASK
        i += 8
    if i + 4 <= n:
        h ^= (struct.unpack_from("<I", data, i)[0] * XXH_P1) & XXH_MASK
        h = (_rotl(h, 23) * XXH_P2 + XXH_P3) & XXH_MASK
        i += 4
    while i < n:
        h ^= (data[i] * XXH_P5) & XXH_MASK
        h = (_rotl(h, 11) * XXH_P1) & XXH_MASK
        i += 1
    h = ((h ^ (h >> 33)) * XXH_P2) & XXH_MASK
    h = ((h ^ (h >> 29)) * XXH_P3) & XXH_MASK
    return h ^ (h >> 32)


# Reference values of the C library (xxhash.h XXH64, seed 0).
XXH64_VECTORS = [(b"", 0xEF46DB3751D8E999), (b"a", 0xD24EC4F1A98C6E5B), (b"abc", 0x44BC2CF5AD770999),
                 (b"Nobody inspects the spammish repetition", 0xFBCEA83C8A378BF1),
                 (bytes((i * 7 + 3) & 0xFF for i in range(1000)), 0x5F235FA033F1A3FB)]


def client(args):
    return boto3.client("s3", endpoint_url=args.endpoint, region_name=args.region,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def cmd_dump(args):
    s3 = client(args)
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=args.bucket, Prefix=args.prefix):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    for i, key in enumerate(keys):
        with open(os.path.join(args.out_dir, str(i)), "wb") as f:
            f.write(s3.get_object(Bucket=args.bucket, Key=key)["Body"].read())
        print("%d\t%s" % (i, key))


def cmd_put(args):
    if len(args.key) != len(args.infile):
        sys.exit("put: give one --in per --key")
    mib = 1024 * 1024
    config = TransferConfig(multipart_threshold=5 * mib, multipart_chunksize=5 * mib, use_threads=False)
    s3 = client(args)
    for key, infile in zip(args.key, args.infile):
        s3.upload_file(infile, args.bucket, key, Config=config)


def cmd_upload_dir(args):
    s3 = client(args)
    count = 0
    for root, dirs, files in os.walk(args.dir):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, args.dir).replace(os.sep, "/")
            s3.upload_file(path, args.bucket, args.prefix.rstrip("/") + "/" + rel)
            count += 1
    print("uploaded %d files" % count)


def cmd_verify_manifest(args):
    for data, expected in XXH64_VECTORS:
        if xxh64(data) != expected:
            sys.exit("verify-manifest: the Python XXH64 gives %016x for %d bytes, not %016x"
                     % (xxh64(data), len(data), expected))
    s3 = client(args)
    prefix = args.prefix.rstrip("/") + "/"
    keys = []
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=args.bucket, Prefix=prefix,
                                                         PaginationConfig={"PageSize": args.page_size})
    for page in pages:
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    problems = []
    checkpoints = objects = 0
    for key in keys:
        match = MANIFEST_RE.match(key[len(prefix):])
        if not match:
            continue
        text = s3.get_object(Bucket=args.bucket, Key=key)["Body"].read()
        manifest = json.loads(text)
        where = "s3://%s/%s" % (args.bucket, key)
        before = len(problems)
        body = {k: v for k, v in manifest.items() if k != "checksum"}
        # The checksum covers the compact dump of the other fields (nlohmann's: keys sorted, UTF-8).
        compact = json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
        if manifest.get("checksum") != "%016x" % xxh64(compact):
            problems.append("%s: checksum %s, the content hashes to %016x" % (where, manifest.get("checksum"),
                                                                                 xxh64(compact)))
        if manifest.get("format") != "trainflow.checkpoint" or manifest.get("version") != 1:
            problems.append("%s: format %r version %r" % (where, manifest.get("format"), manifest.get("version")))
        if manifest.get("step") != int(match.group(2)):
            problems.append("%s: step %r under prefix %s" % (where, manifest.get("step"), match.group(1)))
        for tensor in manifest["tensors"]:
            chunks = sorted(o["chunk"] for o in manifest["objects"] if o.get("tensor") == tensor["name"])
            count = -(-tensor["elements"] // tensor["chunk_elements"])
            if chunks != list(range(count)):
                problems.append("%s: tensor %s of %d elements lists chunks %s, not 0..%d"
                                % (where, tensor["name"], tensor["elements"], chunks, count - 1))
        total = 0
        for entry in manifest["objects"]:
            data = s3.get_object(Bucket=args.bucket, Key=prefix + entry["key"])["Body"].read()
            total += len(data)
            if len(data) != entry["bytes"]:
                problems.append("%s: %s has %d bytes, the manifest says %d" % (where, entry["key"], len(data),
                                                                               entry["bytes"]))
            elif "%016x" % xxh64(data) != entry["xxh64"]:
                problems.append("%s: %s has xxh64 %016x, the manifest says %s" % (where, entry["key"], xxh64(data),
                                                                                  entry["xxh64"]))
        print("%s %s: %d objects, %d bytes, %s" % (match.group(1), manifest.get("kind"), len(manifest["objects"]),
                                                   total, "FAILED" if len(problems) > before else "ok"))
        checkpoints += 1
        objects += len(manifest["objects"])
    if problems:
        sys.stderr.write("\n".join(problems) + "\n")
        sys.exit(1)
    print("verified %d checkpoints, %d objects" % (checkpoints, objects))


def canonical_query(query):
    """The query as SigV4 wants it: pairs sorted, values percent-encoded except A-Za-z0-9-_.~"""
    pairs = []
    for pair in query.split("&") if query else []:
        key, _, value = pair.partition("=")
        pairs.append((urllib.parse.quote(urllib.parse.unquote(key), safe="-_.~"),
                      urllib.parse.quote(urllib.parse.unquote(value), safe="-_.~")))
    return "&".join("%s=%s" % kv for kv in sorted(pairs))


def cmd_verify_sigv4(args):
    with open(args.requests) as f:
        captured = json.load(f)
    key_id = os.environ["AWS_ACCESS_KEY_ID"]
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    token = os.environ.get("AWS_SESSION_TOKEN") or None
    problems = []
    for i, req in enumerate(captured):
        what = "request %d (%s %s)" % (i, req["method"], req["path"])
        headers = {}
        for name, value in req["headers"]:
            headers[name.lower()] = value
        match = AUTH_RE.match(headers.get("authorization", ""))
        if not match:
            problems.append("%s: no SigV4 Authorization header: %r" % (what, headers.get("authorization")))
            continue
        got_key, date, region, signed, signature = match.groups()
        signed_names = signed.split(";")
        if got_key != key_id or region != args.region or not headers.get("x-amz-date", "").startswith(date):
            problems.append("%s: credential scope %s/%s/%s does not match key %s, region %s, x-amz-date %s"
                            % (what, got_key, date, region, key_id, args.region, headers.get("x-amz-date")))
        for needed in ["host", "x-amz-content-sha256", "x-amz-date"] + (["x-amz-security-token"] if token else []):
            if needed not in signed_names:
                problems.append("%s: header %s is not signed (SignedHeaders=%s)" % (what, needed, signed))
        if token and headers.get("x-amz-security-token") != token:
            problems.append("%s: x-amz-security-token is not the session token" % what)
        if headers.get("x-amz-content-sha256") != req["body_sha256"]:
            problems.append("%s: x-amz-content-sha256 %s but the body (%d bytes) hashes to %s"
                            % (what, headers.get("x-amz-content-sha256"), req["body_bytes"], req["body_sha256"]))
        path, _, query = req["path"].partition("?")
        if query != canonical_query(query):
            problems.append("%s: the query %r is not canonical (%r); curl signs it as sent"
                            % (what, query, canonical_query(query)))
        request = AWSRequest(method=req["method"], url="http://%s%s" % (headers["host"], req["path"]),
                             headers={name: headers[name] for name in signed_names if name in headers})
        request.context["timestamp"] = headers["x-amz-date"]
        auth = S3SigV4Auth(Credentials(key_id, secret, token), "s3", args.region)
        canonical = auth.canonical_request(request)
        expected = auth.signature(auth.string_to_sign(request, canonical), request)
        if expected != signature:
            problems.append("%s: signature %s, botocore computes %s for the canonical request:\n%s"
                            % (what, signature, expected, canonical))
    if problems:
        sys.stderr.write("\n".join(problems) + "\n")
        sys.exit(1)
    if not captured:
        sys.stderr.write("no requests to verify\n")
        sys.exit(1)
    print("verified %d requests" % len(captured))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("dump", "put", "upload-dir", "verify-manifest"):
        p = sub.add_parser(name)
        p.add_argument("--endpoint", required=True)
        p.add_argument("--bucket", required=True)
        p.add_argument("--region", default="us-east-1")
    dump = sub.choices["dump"]
    dump.add_argument("--prefix", default="")
    dump.add_argument("--out-dir", required=True)
    put = sub.choices["put"]
    put.add_argument("--key", action="append", required=True)
    put.add_argument("--in", dest="infile", action="append", required=True)
    upload = sub.choices["upload-dir"]
    upload.add_argument("--prefix", required=True)
    upload.add_argument("--dir", required=True)
    verify = sub.choices["verify-manifest"]
    verify.add_argument("--prefix", required=True)
    verify.add_argument("--page-size", type=int, default=1000)
    p = sub.add_parser("verify-sigv4")
    p.add_argument("--requests", required=True)
    p.add_argument("--region", default="us-east-1")
    args = parser.parse_args()
    {"dump": cmd_dump, "put": cmd_put, "upload-dir": cmd_upload_dir, "verify-manifest": cmd_verify_manifest,
     "verify-sigv4": cmd_verify_sigv4}[args.command](args)


if __name__ == "__main__":
    main()
