"""Request and response bodies of the serving API (pydantic v2; docs/serving.md).

Every request model forbids unknown fields and accepts only finite JSON numbers (Python's
``json`` parses the non-standard literals ``NaN`` and ``Infinity``; they are rejected here).
Floats are *strict*: JSON integers are accepted, booleans and numeric strings are not.

The request models whose sizes depend on the served model (B, d, B_r, the number of channel
slots) are built per application by :func:`request_models`, so the OpenAPI schema states the
exact vector lengths a device must send.

Validation rules (the API contract):

* ``alpha`` (PrivateRec, Alg. 1-2): B finite weights, each ≥ 0, |Σα − 1| ≤ 1e-3 (α̃ is a
  softplus-normalised probability vector; :data:`SIMPLEX_TOLERANCE`);
* ``embedding`` (VDP, PrivateRec §3.2.1): d finite numbers;
* Uni-FedRec channels (§3.4): 1..M channels, each B_r weights on the simplex and a finite
  quota ≥ 0, quotas with a positive sum (normalised by the server);
* ``k`` and ``total``: integers 1 ≤ k ≤ 1000 (the handler also caps them at the pool size).

Error messages name the offending field but never echo its value (the server keeps no copy of
query payloads, not even in error text).
"""

# No ``from __future__ import annotations``: the per-app models of request_models() annotate
# with local objects, which must be real annotation objects rather than strings.
import math
from dataclasses import dataclass
from types import GenericAlias
from typing import Annotated, Any, Sequence

from privaterec.ondevice.release import SERVING_MODES
from pydantic import (AllowInfNan, BaseModel, ConfigDict, Field, StrictBool, StrictFloat,
                      StrictInt, StrictStr, create_model, field_validator, model_validator)

MAX_K = 1000
"""Largest ``k`` / ``total`` a query may ask for (also capped at the pool size)."""
MAX_NEWS_PER_REQUEST = 1000
"""Most articles one ``POST /v1/news`` may carry."""
SIMPLEX_TOLERANCE = 1e-3
"""|Σα − 1| allowed for weights on the probability simplex."""
MAX_ID_LENGTH = 128
NEWS_ID_PATTERN = r"^[A-Za-z0-9_.~:-]+$"
"""News ids sent to the API: URL-safe characters (``GET /v1/news/{news_id}`` must reach them)."""
MAX_LABEL_LENGTH = 128
MAX_TITLE_LENGTH = 2_000
MAX_ABSTRACT_LENGTH = 20_000

FiniteFloat = Annotated[StrictFloat, AllowInfNan(False)]
"""A finite JSON number (integers accepted; NaN, ±Infinity, booleans and strings rejected)."""
NonNegativeFloat = Annotated[StrictFloat, AllowInfNan(False), Field(ge=0.0)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


def check_simplex(weights: list[float], name: str) -> list[float]:
    """Raise ``ValueError`` unless ``weights`` are ≥ 0 and sum to 1 within the tolerance."""
    for i, w in enumerate(weights):
        if w < 0:
            raise ValueError(f"{name}[{i}] is negative; {name} must lie on the probability "
                             f"simplex (every weight >= 0, sum 1)")
    if abs(math.fsum(weights) - 1.0) > SIMPLEX_TOLERANCE:
        raise ValueError(f"{name} must sum to 1 (within {SIMPLEX_TOLERANCE:g}); normalise it "
                         f"on the device (PrivateRec Alg. 2 line 10)")
    return weights


def _check_text(value: str, name: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid Unicode text (lone surrogate)") from None
    return value


# --------------------------------------------------------------------------- articles
class NewsItem(_Request):
    """One article to ingest (a MIND ``news.tsv`` row without url and entities)."""

    news_id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_LENGTH,
                                        pattern=NEWS_ID_PATTERN)]
    category: Annotated[StrictStr, Field(max_length=MAX_LABEL_LENGTH)] = ""
    subcategory: Annotated[StrictStr, Field(max_length=MAX_LABEL_LENGTH)] = ""
    title: Annotated[StrictStr, Field(max_length=MAX_TITLE_LENGTH)]
    abstract: Annotated[StrictStr, Field(max_length=MAX_ABSTRACT_LENGTH)] = ""

    @field_validator("news_id", "category", "subcategory", "title", "abstract")
    @classmethod
    def _unicode(cls, value: str, info: Any) -> str:
        return _check_text(value, info.field_name)


class IngestRequest(_Request):
    """``POST /v1/news``: 1..1000 articles with distinct ids (an existing id is updated)."""

    news: Annotated[list[NewsItem], Field(min_length=1, max_length=MAX_NEWS_PER_REQUEST)]

    @field_validator("news")
    @classmethod
    def _distinct(cls, news: list[NewsItem]) -> list[NewsItem]:
        seen: set[str] = set()
        for i, item in enumerate(news):
            if item.news_id in seen:
                raise ValueError(f"news[{i}].news_id repeats an earlier item of the request; "
                                 f"send each article once")
            seen.add(item.news_id)
        return news


class Article(_Response):
    """``GET /v1/news/{news_id}``."""

    news_id: str
    category: str
    subcategory: str
    title: str
    abstract: str


class LookupRequest(_Request):
    """``POST /v1/news/lookup``: 1..1000 news ids (a device's title lookups, maybe with
    decoys mixed in)."""

    ids: Annotated[list[Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_LENGTH)]],
                   Field(min_length=1, max_length=MAX_K)]


class LookupResponse(_Response):
    news: list[Article]
    missing: list[str]


class IngestResponse(_Response):
    added: int
    updated: int
    num_news: int


# ---------------------------------------------------------------------------- queries
# The query bodies' fields and rules, with vectors of any length. request_models() subclasses
# each one per served model to fix the vector lengths in the schema; handlers see these types.
class QueryBody(_Request):
    """A ranking query: a serving mode's release (its ``field``, added per mode) and k."""

    k: Annotated[StrictInt, Field(ge=1, le=MAX_K)] = 10


class RecallChannelBody(_Request):
    """One interest channel: B_r protected weights and its quota."""

    weights: list[FiniteFloat]
    quota: NonNegativeFloat

    @field_validator("weights")
    @classmethod
    def _simplex(cls, weights: list[float]) -> list[float]:
        return check_simplex(weights, "weights")


class RecallQueryBody(_Request):
    """``POST /v1/recall/unifedrec``: 1..M channels and R = ``total`` candidates."""

    channels: Sequence[RecallChannelBody]
    total: Annotated[StrictInt, Field(ge=1, le=MAX_K)] = 100
    include_vectors: StrictBool = True

    @model_validator(mode="after")
    def _quotas(self) -> "RecallQueryBody":
        if not any(c.quota > 0 for c in self.channels):  # all >= 0; fsum could overflow
            raise ValueError("channels: the quotas must have a positive sum")
        return self


@dataclass(frozen=True)
class RequestModels:
    """The request bodies whose vector sizes depend on the served model."""

    query: dict[str, type[QueryBody]]
    """Serving mode name → its query body (the modes with an endpoint)."""
    recall: type[RecallQueryBody]
    channel: type[RecallChannelBody]


def _vector(size: int, description: str) -> Any:
    if size > 0:
        return Annotated[list[FiniteFloat], Field(min_length=size, max_length=size,
                                                  description=description)]
    return Annotated[list[FiniteFloat], Field(min_length=1, max_length=MAX_K,
                                              description=description)]


def _simplex(field: str) -> dict[str, Any]:
    """The validator of a release on the probability simplex (:func:`check_simplex`)."""
    def simplex(cls: type, weights: list[float]) -> list[float]:
        return check_simplex(weights, field)
    return {"simplex": field_validator(field)(simplex)}


def _list_of(item: type[BaseModel], *, max_length: int) -> Any:
    """``Annotated[list[item], Field(min_length=1, max_length=max_length)]`` for a class
    ``item`` built at run time."""
    return Annotated[GenericAlias(list, (item,)), Field(min_length=1, max_length=max_length)]


def request_models(*, basis_size: int, dim: int, recall_basis_size: int = 0,
                   max_channels: int = 5) -> RequestModels:
    """Query models for a served model with B = ``basis_size`` basic vectors (0: none), news
    vectors of size d = ``dim`` and a recall model with B_r basic interests and M channel
    slots (``recall_basis_size`` 0: no recall model; vector lengths are then unconstrained
    in the schema and the endpoint answers 404).

    Each is a subclass of the matching ``*Body`` model (same fields and validators) whose
    vector fields carry the exact lengths."""
    weights_type = _vector(recall_basis_size, "α_i: B_r weights over the basic interests, on "
                                              "the probability simplex")

    # the docstrings become the OpenAPI descriptions
    query = {}
    for mode in SERVING_MODES.values():
        if mode.endpoint:
            doc = f"``POST {mode.endpoint}``: {mode.sends}, and k."
            query[mode.name] = create_model(
                f"{type(mode).__name__}Query", __base__=QueryBody, __doc__=doc,
                __validators__=_simplex(mode.field) if mode.simplex else {},
                **{mode.field: _vector(mode.width(basis_size=basis_size, dim=dim), mode.sends)})
    RecallChannel = create_model("RecallChannel", __base__=RecallChannelBody,
                                 __doc__=RecallChannelBody.__doc__, weights=weights_type)
    RecallQuery = create_model(
        "RecallQuery", __base__=RecallQueryBody, __doc__=RecallQueryBody.__doc__,
        channels=_list_of(RecallChannel, max_length=max(1, max_channels)))
    return RequestModels(query, RecallQuery, RecallChannel)


class RecommendedItem(_Response):
    news_id: str
    title: str
    category: str
    score: float


class RecommendResponse(_Response):
    model_version: str
    items: list[RecommendedItem]


class RecallCandidate(_Response):
    news_id: str
    title: str
    category: str
    subcategory: str
    abstract: str
    channel: int
    vector: list[float] | None


class RecallResponse(_Response):
    model_version: str
    candidates: list[RecallCandidate]


# ------------------------------------------------------------------------------- model
class HealthResponse(_Response):
    status: str
    num_news: int
    model_version: str


class RecallInfo(_Response):
    basis_size: int
    dim: int
    max_channels: int
    parameters_url: str


class ModelInfo(_Response):
    model_version: str
    method: str
    news_encoder: str
    basis_size: int
    dim: int
    num_news: int
    parameters_url: str
    recall: RecallInfo | None
    privacy_note: str


class ErrorResponse(_Response):
    """Every 4xx body: ``detail`` is a message, or a list of ``{loc, msg, type}``."""

    detail: str | list[dict[str, Any]]


__all__ = ["Article", "ErrorResponse", "FiniteFloat", "HealthResponse", "IngestRequest",
           "IngestResponse", "LookupRequest", "LookupResponse", "MAX_K",
           "MAX_NEWS_PER_REQUEST", "ModelInfo", "NewsItem", "QueryBody",
           "RecallCandidate", "RecallChannelBody", "RecallInfo", "RecallQueryBody",
           "RecallResponse", "RecommendResponse", "RecommendedItem", "RequestModels",
           "SIMPLEX_TOLERANCE", "check_simplex", "request_models"]
