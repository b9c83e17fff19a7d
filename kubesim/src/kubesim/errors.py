"""API errors as the API server reports them: a `Status` object with a code and a reason."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request the API server refuses; `status()` is the body a client decodes."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(name: str, group: str, plural: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return details


def group_resource(group: str, plural: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{group_resource(group, plural)} "{name}" not found',
        details=_details(name, group, plural),
    )


def already_exists(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{group_resource(group, plural)} "{name}" already exists',
        details=_details(name, group, plural),
    )


def conflict(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {group_resource(group, plural)} "{name}": '
        "the object has been modified; please apply your changes to the latest version "
        "and try again",
        details=_details(name, group, plural),
    )


#: a field error's wording → its cause type (k8s.io/apimachinery/pkg/util/validation/field)
_CAUSE_TYPES = (("Required value", "FieldValueRequired"), ("Too long", "FieldValueTooLong"),
                ("Unsupported value", "FieldValueNotSupported"), ("Forbidden", "FieldValueForbidden"),
                ("Duplicate value", "FieldValueDuplicate"), ("Not found", "FieldValueNotFound"))


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid; `causes` are (field, message) pairs as the validators word them (the message
    is the field error's ErrorBody, e.g. "Too long: may not be more than 262144 bytes").

    As apierrors.NewInvalid: each cause's type is the field error's, its message the error
    body without the field (kubectl prints `field: message` from the causes)."""
    qualified = f"{kind}.{group}" if group else kind
    text = "; ".join(f"{field}: {message}" for field, message in causes)
    plural_message = f'{qualified} "{name}" is invalid: {text}'
    details = {
        "name": name,
        "kind": kind,
        "causes": [
            {"reason": _cause_type(message), "message": message, "field": field}
            for field, message in causes
        ],
    }
    if group:
        details["group"] = group
    return ApiError(422, "Invalid", plural_message, details=details)


def _cause_type(message: str) -> str:
    for prefix, cause in _CAUSE_TYPES:
        if message.startswith(prefix):
            return cause
    return "FieldValueInvalid"


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(message: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", message)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "Forbidden", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def page_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")
