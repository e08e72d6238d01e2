#!/usr/bin/env python3
"""The boto3/botocore side of tests/checkpoint/s3_store_test.cpp: a standard S3 client that reads
and writes the objects of our store, and an independent SigV4 check of our signed requests.

Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN; the endpoint
and bucket from the command line. Path-style addressing, region us-east-1 unless --region.

  s3_interop.py dump --endpoint URL --bucket B --prefix P --out-dir D
                       lists the keys under P (ListObjectsV2, paginated) and writes the i-th
                       object to D/i; prints "i<TAB>key" a line
  s3_interop.py put  --endpoint URL --bucket B --key K --in F [--key K2 --in F2 ...]
                       file F as object K (multipart in 5 MiB parts above 5 MiB, as boto3's
                       transfer manager does)
  s3_interop.py verify-sigv4 --requests F                           F: JSON list of captured
                       requests (s3_fault_proxy.py's /__proxy/captured); recomputes each
                       Authorization signature with botocore's S3SigV4Auth and checks the payload
                       hash against the body the proxy saw; prints "verified N requests"
Exits 0 on success, 1 with a message on stderr otherwise.
"""
import argparse
import os
import re
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


def canonical_query(query):
    """The query as SigV4 wants it: pairs sorted, values percent-encoded except A-Za-z0-9-_.~"""
    pairs = []
    for pair in query.split("&") if query else []:
        key, _, value = pair.partition("=")
        pairs.append((urllib.parse.quote(urllib.parse.unquote(key), safe="-_.~"),
                      urllib.parse.quote(urllib.parse.unquote(value), safe="-_.~")))
    return "&".join("%s=%s" % kv for kv in sorted(pairs))


def cmd_verify_sigv4(args):
    import json
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
    for name in ("dump", "put"):
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
    p = sub.add_parser("verify-sigv4")
    p.add_argument("--requests", required=True)
    p.add_argument("--region", default="us-east-1")
    args = parser.parse_args()
    {"dump": cmd_dump, "put": cmd_put, "verify-sigv4": cmd_verify_sigv4}[args.command](args)


if __name__ == "__main__":
    main()
