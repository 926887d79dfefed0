"""A real S3 server for tests: moto in server mode, in its own process, with authentication on
(its first 4 requests may go unsigned: they create the IAM user, its policy and its key). The
product reaches it only through the object store's own variables (``AWS_ENDPOINT``, ...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

REGION = "us-east-1"
BUCKET = "rag"
PROCESSES: dict[str, subprocess.Popen[bytes]] = {}
"""The server process of each running endpoint (issue 52's readiness test stops and resumes
one with SIGSTOP / SIGCONT)."""


@contextmanager
def auth_s3_server(bucket: str = BUCKET) -> Iterator[dict[str, str]]:
    """Start the server with ``bucket``; yields the ``AWS_*`` settings of an IAM user's key."""
    import boto3
    import httpx

    from rag_assets_tests.helpers import free_port, stop_process

    port = free_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="4")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    boot = {"endpoint_url": endpoint, "region_name": REGION}
    boot |= {"aws_access_key_id": "boot", "aws_secret_access_key": "boot"}
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                httpx.get(endpoint, timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        iam = boto3.client("iam", **boot)
        iam.create_user(UserName="indexer")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*"}]}
        policy["Statement"][0]["Resource"] = "*"
        iam.put_user_policy(UserName="indexer", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="indexer")["AccessKey"]
        aws = {
            "AWS_ENDPOINT": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                          aws_access_key_id=key["AccessKeyId"],
                          aws_secret_access_key=key["SecretAccessKey"])  # fmt: skip
        s3.create_bucket(Bucket=bucket)
        PROCESSES[endpoint] = proc
        yield aws
    finally:
        PROCESSES.pop(endpoint, None)
        stop_process(proc)


def storage_options(aws: dict[str, str]) -> dict[str, str]:
    """The same settings as LanceDB storage options."""
    return {
        "endpoint": aws["AWS_ENDPOINT"],
        "allow_http": "true",
        "region": aws["AWS_REGION"],
        "aws_access_key_id": aws["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": aws["AWS_SECRET_ACCESS_KEY"],
    }


def object_keys(aws: dict[str, str], prefix: str, bucket: str = BUCKET) -> list[str]:
    """Every key under ``prefix`` in the bucket."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=aws["AWS_ENDPOINT"], region_name=aws["AWS_REGION"],
                      aws_access_key_id=aws["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=aws["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys
