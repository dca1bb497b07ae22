# SPDX-License-Identifier: MIT
"""AWS's credential services on loopback, for libloader's side of them
(client/libloader/awsroles.c): STS's AssumeRoleWithWebIdentity and
AssumeRole (whose SigV4 signature it verifies), a container's credentials endpoint (ECS, EKS Pod Identity) and an EC2
instance's metadata service (IMDSv2 and v1). These run only inside AWS, so
the suite stands them in with the wire formats of AWS's documentation; the
keys they hand out are real keys of the suite's S3 server (s3server.py),
so a pipeline made with them reads the bucket for real.

The suite's server refuses a session token it did not issue itself, so by
default the keys go without one (session_token None: no "Token", no
<SessionToken>); with one, a test sees it sent and signed, and refused.

Each request is kept (method, path, headers, body) in .requests; .fail maps
a service ("sts", "container", "imds-token", "imds") to (status, body) to
answer instead.
"""

import hashlib
import hmac
import http.server
import json
import re
import threading
import urllib.parse

ROLE_ARN = "arn:aws:iam::123456789012:role/ldr-trainer"
WEB_TOKEN = "eyJhbGciOiJSUzI1NiJ9.ldr-web-identity.sig"
CONTAINER_AUTH = "ldr-pod-identity-token"
IMDS_ROLE = "ldr-instance-role"
EXPIRES = "2099-01-01T00:00:00Z"


class AwsMeta:
    def __init__(self, keys, session_token=None):
        self.ak, self.sk = keys
        self.token = session_token
        self.requests = []
        self.fail = {}
        self.secrets = {self.ak: self.sk}  # the keys an AssumeRole may be signed with
        self.signed = []  # (key id, region, signed headers) of each AssumeRole verified
        self.imds_tokens = set()
        meta = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self, status, body, ctype="application/json"):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def keep(self, body=b""):
                meta.requests.append((self.command, self.path, dict(self.headers), body))

            def do_PUT(self):
                self.keep()
                if self.path != "/latest/api/token":
                    return self.answer(404, "")
                if "imds-token" in meta.fail:
                    return self.answer(*meta.fail["imds-token"], ctype="text/plain")
                if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self.answer(400, "", ctype="text/plain")
                tok = f"imds-token-{len(meta.imds_tokens)}"
                meta.imds_tokens.add(tok)
                self.answer(200, tok, ctype="text/plain")

            def do_GET(self):
                self.keep()
                if self.path.startswith("/latest/meta-data/iam/security-credentials/"):
                    if "imds" in meta.fail:
                        return self.answer(*meta.fail["imds"])
                    tok = self.headers.get("X-aws-ec2-metadata-token")
                    if tok is not None and tok not in meta.imds_tokens:
                        return self.answer(401, "", ctype="text/plain")
                    role = self.path.rsplit("/", 1)[1]
                    if not role:
                        return self.answer(200, IMDS_ROLE + "\n", ctype="text/plain")
                    if role != IMDS_ROLE:
                        return self.answer(404, "")
                    return self.answer(200, json.dumps(meta.keys({
                        "Code": "Success", "LastUpdated": "2026-12-06T00:00:00Z", "Type": "AWS-HMAC"})))
                if self.path == "/creds":
                    if "container" in meta.fail:
                        return self.answer(*meta.fail["container"])
                    if self.headers.get("Authorization") != CONTAINER_AUTH:
                        return self.answer(401, '{"Message": "bad Authorization"}')
                    return self.answer(200, json.dumps(meta.keys({"RoleArn": ROLE_ARN,
                                                                  "AccountId": "123456789012"})))
                self.answer(404, "")

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.keep(body)
                form = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
                if "sts" in meta.fail:
                    return self.answer(*meta.fail["sts"], ctype="text/xml")
                if form.get("Action") == "AssumeRole":
                    why = meta.check_sigv4(self.command, self.path, self.headers, body)
                    if why:
                        return self.answer(403, sts_error(*why), ctype="text/xml")
                    if form.get("RoleArn") != ROLE_ARN:
                        return self.answer(403, sts_error("AccessDenied", "Not authorized to perform "
                                                          "sts:AssumeRole"), ctype="text/xml")
                    return self.answer(200, meta.sts_answer("AssumeRole", form), ctype="text/xml")
                if form.get("Action") != "AssumeRoleWithWebIdentity" or form.get("Version") != "2011-06-15":
                    return self.answer(400, sts_error("InvalidAction", "no such action"), ctype="text/xml")
                if form.get("WebIdentityToken") != WEB_TOKEN:
                    return self.answer(400, sts_error("InvalidIdentityToken", "Couldn't retrieve verification "
                                                      "key from your identity provider"), ctype="text/xml")
                if form.get("RoleArn") != ROLE_ARN:
                    return self.answer(403, sts_error("AccessDenied", "Not authorized to perform "
                                                      "sts:AssumeRoleWithWebIdentity"), ctype="text/xml")
                self.answer(200, meta.sts_answer("AssumeRoleWithWebIdentity", form), ctype="text/xml")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def sts_answer(self, action, form):
        """STS's answer to @action: the keys as <Credentials>."""
        token = f"<SessionToken>{xml_escape(self.token)}</SessionToken>" if self.token else ""
        return f"""<{action}Response xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <{action}Result>
    <AssumedRoleUser><Arn>{ROLE_ARN}/{form.get("RoleSessionName")}</Arn></AssumedRoleUser>
    <Credentials>
      {token}
      <SecretAccessKey>{xml_escape(self.sk)}</SecretAccessKey>
      <Expiration>{EXPIRES}</Expiration>
      <AccessKeyId>{self.ak}</AccessKeyId>
    </Credentials>
  </{action}Result>
</{action}Response>"""

    def check_sigv4(self, method, path, headers, body):
        """None when the request is signed (SigV4, AWS's documented
        algorithm, the payload's hash signed) by a key of .secrets for
        service sts; else (code, message) as STS answers."""
        auth = headers.get("Authorization", "")
        m = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/sts/aws4_request, "
                         r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})", auth)
        if not m:
            return ("MissingAuthenticationToken", "Request is missing Authentication Token")
        ak, day, region, signed, sig = m.groups()
        if ak not in self.secrets:
            return ("InvalidClientTokenId", "The security token included in the request is invalid.")
        names = signed.split(";")
        if "host" not in names or "x-amz-date" not in names:
            return ("SignatureDoesNotMatch", "host and x-amz-date must be signed")
        canon = "".join(f"{n}:{' '.join(headers.get(n, '').split())}\n" for n in names)
        creq = "\n".join([method, path.split("?")[0], path.partition("?")[2], canon, signed,
                          hashlib.sha256(body).hexdigest()])
        scope = f"{day}/{region}/sts/aws4_request"
        sts = "\n".join(["AWS4-HMAC-SHA256", headers.get("x-amz-date", ""), scope,
                         hashlib.sha256(creq.encode()).hexdigest()])
        k = ("AWS4" + self.secrets[ak]).encode()
        for part in (day, region, "sts", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        if hmac.new(k, sts.encode(), hashlib.sha256).hexdigest() != sig:
            return ("SignatureDoesNotMatch", "The request signature we calculated does not match the signature "
                    "you provided.")
        self.signed.append((ak, region, names))
        return None

    def keys(self, more):
        """A metadata answer: @more and the keys."""
        k = dict(more, AccessKeyId=self.ak, SecretAccessKey=self.sk, Expiration=EXPIRES)
        if self.token:
            k["Token"] = self.token
        return k

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def xml_escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def sts_error(code, message):
    return (f'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>'
            f"<Code>{code}</Code><Message>{message}</Message></Error><RequestId>r-1</RequestId></ErrorResponse>")
