"""Schemathesis hooks for scripts/schemathesis.sh: one check, `listed_validation_answers`.

The contract states every rule a JSON Schema can express, so a schema-valid request
should never get the specification's validation answer (422 on send-message, 400 on
the PBX webhook), except for a rule no schema can express. Those rules are listed in
schemathesis.toml under [checks.listed_validation_answers], each with its reason; this
check fails a schema-valid request whose validation answer is not one of them.
`positive_data_acceptance` lets that one status through (see schemathesis.toml), so
the two together accept exactly the listed answers.
"""

import json

import schemathesis

# The status of the specification's validation answer, by operation.
VALIDATION_STATUS = {"message_send": 422, "pbx_webhook": 400}


@schemathesis.check
class listed_validation_answers:
    """A schema-valid request may only be refused for a rule listed in schemathesis.toml."""

    def __init__(self, message_send=(), pbx_webhook=()):
        self.rules = {"message_send": list(message_send), "pbx_webhook": list(pbx_webhook)}
        for operation, rules in self.rules.items():
            for rule in rules:
                missing = {"error", "field", "reason"} - set(rule)
                if missing:
                    raise ValueError(f"{operation} rule {rule!r} lacks {', '.join(sorted(missing))}")

    def after_response(self, ctx, response, case):
        meta = case.meta
        if meta is None or not meta.generation.mode.is_positive:
            return None
        operation = case.operation.schema.get_operation_id(case.operation)
        if response.status_code != VALIDATION_STATUS.get(operation):
            return None
        try:
            body = json.loads(response.text)
            error, message = body["error"], body["message"]
            field = (body.get("details") or {}).get("field") or ""
        except (ValueError, KeyError, TypeError):
            raise AssertionError(f"{response.status_code} without the error body") from None
        for rule in self.rules.get(operation, []):
            if rule["error"] == error and rule["field"] == field and rule.get("message", "") in message:
                return None
        raise AssertionError(
            f"A schema-valid request got {response.status_code} `{error}` (field `{field}`): {message}\n"
            "If a schema can express this rule, state it in the contract; if not, list it in "
            "schemathesis.toml under [checks.listed_validation_answers] with its reason."
        )
