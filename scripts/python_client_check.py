"""The checks of scripts/python-client.sh: a client generated from openapi/openapi.json by
openapi-python-client (importable as `gateway_client`), used as a Python user would,
against a running gateway. Run by that script, which generates the client, starts the
gateway and sets:

    PYCLIENT_BASE_URL, PYCLIENT_API_KEY, PYCLIENT_INSTANCE,
    PYCLIENT_PBX_INTEGRATION, PYCLIENT_PBX_SECRET, PYCLIENT_CONTRACT

Exits non-zero at the first failed check. Ends with "N passed, 0 failed".
"""

import base64
import os
import re
import struct
import sys
import typing
import zlib

import httpx

import gateway_client.models as models  # the names first: the checks below say which title is missing
from gateway_client import AuthenticatedClient
from gateway_client.api.messages import message_send
from gateway_client.api.pbx import pbx_webhook

BASE_URL = os.environ["PYCLIENT_BASE_URL"]
API_KEY = os.environ["PYCLIENT_API_KEY"]
INSTANCE = os.environ["PYCLIENT_INSTANCE"]
PBX_INTEGRATION = int(os.environ["PYCLIENT_PBX_INTEGRATION"])
PBX_SECRET = os.environ["PYCLIENT_PBX_SECRET"]
CONTRACT = os.environ["PYCLIENT_CONTRACT"]

# The titles of the request bodies' branches, in the contract's order.
SEND_TITLES = ["TextMessage", "ImageMessage", "AudioMessage", "DocumentMessage"]
PBX_TITLES = ["PbxTestEvent", "PbxOutboundMessage", "PbxCallEvent"]

passed = 0


def check(what, condition, seen=None):
    global passed
    if not condition:
        print(f"FAILED: {what}" + (f"\n  got: {seen!r}" if seen is not None else ""), file=sys.stderr)
        print(f"{passed} passed, 1 failed")
        sys.exit(1)
    passed += 1
    print(f"ok: {what}")


def png_1x1():
    """A real 1x1 PNG (the gateway checks the content's signature)."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


def body_classes(function):
    """The classes the generated operation takes as its body."""
    return {c.__name__ for c in typing.get_args(typing.get_type_hints(function)["body"])}


def send(client, body):
    response = message_send.sync_detailed(client=client, body=body)
    return response.status_code, response.parsed


def refusal(what, answer, status, code):
    got_status, parsed = answer
    check(
        f"{what}: {status} {code}, read as ErrorBody",
        got_status == status
        and isinstance(parsed, models.ErrorBody)
        and parsed.error == code
        and parsed.success is False,
        (got_status, parsed),
    )
    return parsed


def main():
    # ---- the generated names are the contract's titles ----
    names = list(models.__all__)
    missing = [t for t in SEND_TITLES + PBX_TITLES if t not in names]
    check(
        "a model for every title: " + ", ".join(SEND_TITLES + PBX_TITLES), not missing, f"missing {missing} in {names}"
    )
    numbered = [n for n in names if re.search(r"Type\d", n)]
    check("no model is named by position (Type0 ...)", not numbered, numbered)
    check(
        "send-message takes exactly the titled bodies",
        body_classes(message_send.sync_detailed) == set(SEND_TITLES),
        body_classes(message_send.sync_detailed),
    )
    check(
        "the PBX webhook takes exactly the titled bodies",
        body_classes(pbx_webhook.sync_detailed) == set(PBX_TITLES),
        body_classes(pbx_webhook.sync_detailed),
    )

    # The classes, once their names are known to be there.
    from gateway_client.models import (
        DocumentMessage,
        DocumentMessageMediaType,
        ImageMessage,
        ImageMessageMediaType,
        MessagePurpose,
        PbxOutboundMessage,
        PbxOutboundMessageEventType,
        PbxTestEvent,
        PbxTestEventEventType,
        PbxWebhookResponse,
        SendMessageResponse,
        TextMessage,
    )

    # ---- the client was generated from what the gateway serves ----
    served = httpx.get(f"{BASE_URL}/openapi.json").content
    with open(CONTRACT, "rb") as f:
        check(
            "GET /openapi.json serves openapi/openapi.json (if not: the gateway binary is older than the file, rebuild it)",
            served == f.read(),
        )

    with AuthenticatedClient(base_url=BASE_URL, token=API_KEY, raise_on_unexpected_status=True) as client:
        # ---- sends: 200, read as SendMessageResponse ----
        status, parsed = send(
            client,
            TextMessage(
                instance_id=INSTANCE,
                phone="+14155550123",
                message_purpose=MessagePurpose.TRANSACTIONAL,
                message="Your code is 123456",
            ),
        )
        check(
            "TextMessage: 200, sent",
            status == 200
            and isinstance(parsed, SendMessageResponse)
            and parsed.success
            and parsed.status == "sent"
            and parsed.message_type == "text"
            and parsed.message_id
            and parsed.log_id > 0,
            (status, parsed),
        )

        status, parsed = send(
            client,
            ImageMessage(
                instance_id=INSTANCE,
                phone="+14155550124",
                message_purpose=MessagePurpose.SUPPORT,
                media_type=ImageMessageMediaType.IMAGE,
                mime_type="image/png",
                file_name="receipt.png",
                media=base64.b64encode(png_1x1()).decode(),
                caption="Your receipt",
            ),
        )
        check(
            "ImageMessage: 200, sent as image",
            status == 200
            and isinstance(parsed, SendMessageResponse)
            and parsed.status == "sent"
            and parsed.message_type == "image",
            (status, parsed),
        )

        status, parsed = send(
            client,
            DocumentMessage(
                instance_id=INSTANCE,
                phone="+14155550124",
                message_purpose=MessagePurpose.TRANSACTIONAL,
                media_type=DocumentMessageMediaType.DOCUMENT,
                mime_type="application/pdf",
                file_name="invoice.pdf",
                media="data:application/pdf;base64," + base64.b64encode(PDF).decode(),
            ),
        )
        check(
            "DocumentMessage (data URL): 200, sent as document",
            status == 200 and isinstance(parsed, SendMessageResponse) and parsed.message_type == "document",
            (status, parsed),
        )

        # ---- refusals: the error body and its details ----
        denied = refusal(
            "a promotion sent as transactional",
            send(
                client,
                TextMessage(
                    instance_id=INSTANCE,
                    phone="+14155550125",
                    message_purpose=MessagePurpose.TRANSACTIONAL,
                    message="Black Friday: 50% OFF everything, promo code BF50!",
                ),
            ),
            403,
            "policy_violation",
        )
        details = denied.details
        check(
            "the policy denial's details: policy, rule, action, risk score",
            details["policy"] == "content@1.0.0"
            and details["rule"] == "marketing_content"
            and details["action"] == "block"
            and details["risk_score"] >= 70,
            details.to_dict(),
        )

        refusal(
            "an unknown instance",
            send(
                client,
                TextMessage(
                    instance_id="no-such-instance",
                    phone="+14155550123",
                    message_purpose=MessagePurpose.SUPPORT,
                    message="Hello",
                ),
            ),
            404,
            "invalid_instance",
        )

    with AuthenticatedClient(base_url=BASE_URL, token="gw_not_a_key", raise_on_unexpected_status=True) as bad:
        refusal(
            "a bad API key",
            send(
                bad,
                TextMessage(
                    instance_id=INSTANCE, phone="+14155550123", message_purpose=MessagePurpose.SUPPORT, message="Hello"
                ),
            ),
            401,
            "invalid_api_key",
        )

    # ---- the PBX webhook: its secret as the client's auth header ----
    pbx = AuthenticatedClient(
        base_url=BASE_URL,
        token=PBX_SECRET,
        prefix="",
        auth_header_name="X-Gateway-3CX-Secret",
        raise_on_unexpected_status=True,
    )
    with pbx:
        answer = pbx_webhook.sync_detailed(
            PBX_INTEGRATION, client=pbx, body=PbxTestEvent(event_type=PbxTestEventEventType.TEST)
        )
        check(
            "PbxTestEvent: 200, received",
            answer.status_code == 200
            and isinstance(answer.parsed, PbxWebhookResponse)
            and answer.parsed.action == "received",
            (answer.status_code, answer.parsed),
        )
        answer = pbx_webhook.sync_detailed(
            PBX_INTEGRATION,
            client=pbx,
            body=PbxOutboundMessage(
                event_type=PbxOutboundMessageEventType.OUTBOUND_MESSAGE,
                to="+14155550126",
                message_text="We tried to reach you; call us back any time.",
            ),
        )
        check(
            "PbxOutboundMessage: 200, message sent",
            answer.status_code == 200
            and isinstance(answer.parsed, PbxWebhookResponse)
            and answer.parsed.action == "message_sent"
            and answer.parsed.message_id,
            (answer.status_code, answer.parsed),
        )
    with AuthenticatedClient(
        base_url=BASE_URL,
        token="wrong",
        prefix="",
        auth_header_name="X-Gateway-3CX-Secret",
        raise_on_unexpected_status=True,
    ) as wrong:
        answer = pbx_webhook.sync_detailed(
            PBX_INTEGRATION, client=wrong, body=PbxTestEvent(event_type=PbxTestEventEventType.TEST)
        )
        refusal("a wrong PBX secret", (answer.status_code, answer.parsed), 401, "invalid_pbx_webhook")

    print(f"python-client: {passed} passed, 0 failed")


if __name__ == "__main__":
    main()
