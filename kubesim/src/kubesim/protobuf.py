"""Decode Kubernetes protobuf request bodies into the dict their JSON form would be.

kubectl's typed clients (every ``kubectl create <kind>`` generator, ``kubectl autoscale``,
``kubectl create token``, ``kubectl create job --from``) always send
``application/vnd.kubernetes.protobuf`` bodies, whatever discovery says, and never fall back to
JSON. A body is the ``k8s\\x00`` magic followed by a ``runtime.Unknown`` envelope whose ``raw`` is
the object's gogo-generated protobuf encoding (without TypeMeta, which the envelope carries).

``decode_protobuf_object`` turns such a body into exactly what ``encoding/json`` would print for the
decoded Go object, so the rest of kubesim can treat JSON and protobuf bodies alike:

* field names and nesting of the JSON API (inline structs such as ``VolumeSource`` are flattened);
* ``omitempty`` rules: gogo writes every non-pointer field, so zero values are dropped where the Go
  field has ``omitempty`` and kept where it has not; non-pointer structs are always present (Go's
  JSON encoder never omits a struct), so ``"status": {}`` and ``"creationTimestamp": null`` appear
  just as kubectl prints them; pointer fields appear only when sent;
* ``metav1.Time`` as RFC 3339 (``null`` when zero), ``IntOrString`` as int or str,
  ``resource.Quantity`` as its string, ``[]byte`` as base64, maps as key-sorted dicts.

The message tables below were transcribed from the ``generated.proto`` descriptors of
k8s.io/api and k8s.io/apimachinery (as compiled into kubectl 1.32, gogoproto ``nullable`` giving
pointer-ness), with ``omitempty`` taken from the Go struct tags (``json:"…"`` beside
``protobuf:"…"``) and, where a tag was ambiguous, from the OpenAPI ``required`` list.
Unknown field numbers are skipped, as the Go decoder does, so newer clients stay decodable.

This module does no I/O. Every malformed or unsupported input raises ``ProtobufDecodeError``; work
is linear in the input size because the schema is not recursive.
"""

from __future__ import annotations

import base64
import datetime
import enum
import json
import re
from collections.abc import Iterator
from typing import Any, TypeAlias

import attrs

__all__ = ["MAGIC", "ProtobufDecodeError", "decode_protobuf_object", "supported_kinds"]

#: Prefix of every Kubernetes protobuf body (``k8s.io/apimachinery/pkg/runtime/serializer/protobuf``).
MAGIC = b"k8s\x00"

#: The only inner content type the Unknown envelope may announce (empty means the same).
_PROTOBUF_CONTENT_TYPE = "application/vnd.kubernetes.protobuf"


class ProtobufDecodeError(ValueError):
    """The request body is not a protobuf object kubesim can decode (the client's fault: 400/415)."""


# --------------------------------------------------------------------------------------------------
# Descriptor model


class Scalar(enum.Enum):
    """How one wire value becomes one JSON value."""

    STRING = "string"
    BYTES = "bytes"  # []byte: base64 in JSON
    BOOL = "bool"
    INT32 = "int32"
    INT64 = "int64"
    # apimachinery messages with a custom JSON form:
    TIME = "metav1.Time"  # {seconds, nanos} -> RFC 3339 seconds, null when zero
    MICROTIME = "metav1.MicroTime"  # {seconds, nanos} -> RFC 3339 microseconds
    INT_OR_STRING = "intstr.IntOrString"  # {type, intVal, strVal} -> int | str
    QUANTITY = "resource.Quantity"  # {string} -> str
    RAW_JSON = "raw JSON"  # FieldsV1 {Raw}: the bytes are JSON already


class Presence(enum.Enum):
    """When a field appears in the JSON form; follows from Go pointer-ness and ``omitempty``."""

    OMIT = "omitempty"  # value type with omitempty: dropped when zero/empty
    ALWAYS = "always"  # value type without omitempty, or any struct: zero value when not sent
    POINTER = "pointer"  # pointer with omitempty: present iff sent (even when zero)
    POINTER_OR_NULL = "pointer, no omitempty"  # pointer without omitempty: null when not sent
    INLINE = "inline"  # embedded struct (json:",inline"): its fields join the parent


@attrs.frozen
class Repeated:
    """A Go slice of ``item``."""

    item: Scalar | str


@attrs.frozen
class Map:
    """A Go ``map[string]value`` (protobuf map entry: key = 1, value = 2)."""

    value: Scalar | str


Kind: TypeAlias = Scalar | str | Repeated | Map  # str names a message in _MESSAGES


@attrs.frozen(kw_only=True)
class Field:
    """One protobuf field of a message and how it shows in JSON (json_name "" when inline)."""

    number: int
    json_name: str
    kind: Kind
    presence: Presence


@attrs.frozen(kw_only=True)
class Message:
    """A message table, named "<group>/<version>.<Type>" as in k8s.io/api's package layout."""

    name: str
    fields: tuple[Field, ...]  # Go struct order, which is JSON output order
    by_number: dict[int, Field] = attrs.field(eq=False)


STRING, BYTES, BOOL = Scalar.STRING, Scalar.BYTES, Scalar.BOOL
INT32, INT64 = Scalar.INT32, Scalar.INT64
TIME, MICROTIME = Scalar.TIME, Scalar.MICROTIME
INT_OR_STRING, QUANTITY, RAW_JSON = Scalar.INT_OR_STRING, Scalar.QUANTITY, Scalar.RAW_JSON
OMIT, ALWAYS, POINTER = Presence.OMIT, Presence.ALWAYS, Presence.POINTER
POINTER_OR_NULL, INLINE = Presence.POINTER_OR_NULL, Presence.INLINE


# fmt: off
# Transcribed tables: message -> (field number, JSON name, kind, presence), in Go struct order.
_MESSAGES: dict[str, tuple[tuple[int, str, Kind, Presence], ...]] = {
    'apps/v1.DaemonSet': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'apps/v1.DaemonSetSpec', ALWAYS),
        (3, 'status', 'apps/v1.DaemonSetStatus', ALWAYS),
    ),
    'apps/v1.DaemonSetCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (3, 'lastTransitionTime', TIME, ALWAYS),
        (4, 'reason', STRING, OMIT),
        (5, 'message', STRING, OMIT),
    ),
    'apps/v1.DaemonSetSpec': (
        (1, 'selector', 'meta/v1.LabelSelector', POINTER_OR_NULL),
        (2, 'template', 'core/v1.PodTemplateSpec', ALWAYS),
        (3, 'updateStrategy', 'apps/v1.DaemonSetUpdateStrategy', ALWAYS),
        (4, 'minReadySeconds', INT32, OMIT),
        (6, 'revisionHistoryLimit', INT32, POINTER),
    ),
    'apps/v1.DaemonSetStatus': (
        (1, 'currentNumberScheduled', INT32, ALWAYS),
        (2, 'numberMisscheduled', INT32, ALWAYS),
        (3, 'desiredNumberScheduled', INT32, ALWAYS),
        (4, 'numberReady', INT32, ALWAYS),
        (5, 'observedGeneration', INT64, OMIT),
        (6, 'updatedNumberScheduled', INT32, OMIT),
        (7, 'numberAvailable', INT32, OMIT),
        (8, 'numberUnavailable', INT32, OMIT),
        (9, 'collisionCount', INT32, POINTER),
        (10, 'conditions', Repeated('apps/v1.DaemonSetCondition'), OMIT),
    ),
    'apps/v1.DaemonSetUpdateStrategy': (
        (1, 'type', STRING, OMIT),
        (2, 'rollingUpdate', 'apps/v1.RollingUpdateDaemonSet', POINTER),
    ),
    'apps/v1.Deployment': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'apps/v1.DeploymentSpec', ALWAYS),
        (3, 'status', 'apps/v1.DeploymentStatus', ALWAYS),
    ),
    'apps/v1.DeploymentCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (6, 'lastUpdateTime', TIME, ALWAYS),
        (7, 'lastTransitionTime', TIME, ALWAYS),
        (4, 'reason', STRING, OMIT),
        (5, 'message', STRING, OMIT),
    ),
    'apps/v1.DeploymentSpec': (
        (1, 'replicas', INT32, POINTER),
        (2, 'selector', 'meta/v1.LabelSelector', POINTER_OR_NULL),
        (3, 'template', 'core/v1.PodTemplateSpec', ALWAYS),
        (4, 'strategy', 'apps/v1.DeploymentStrategy', ALWAYS),
        (5, 'minReadySeconds', INT32, OMIT),
        (6, 'revisionHistoryLimit', INT32, POINTER),
        (7, 'paused', BOOL, OMIT),
        (9, 'progressDeadlineSeconds', INT32, POINTER),
    ),
    'apps/v1.DeploymentStatus': (
        (1, 'observedGeneration', INT64, OMIT),
        (2, 'replicas', INT32, OMIT),
        (3, 'updatedReplicas', INT32, OMIT),
        (7, 'readyReplicas', INT32, OMIT),
        (4, 'availableReplicas', INT32, OMIT),
        (5, 'unavailableReplicas', INT32, OMIT),
        (6, 'conditions', Repeated('apps/v1.DeploymentCondition'), OMIT),
        (8, 'collisionCount', INT32, POINTER),
    ),
    'apps/v1.DeploymentStrategy': (
        (1, 'type', STRING, OMIT),
        (2, 'rollingUpdate', 'apps/v1.RollingUpdateDeployment', POINTER),
    ),
    'apps/v1.ReplicaSet': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'apps/v1.ReplicaSetSpec', ALWAYS),
        (3, 'status', 'apps/v1.ReplicaSetStatus', ALWAYS),
    ),
    'apps/v1.ReplicaSetCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (3, 'lastTransitionTime', TIME, ALWAYS),
        (4, 'reason', STRING, OMIT),
        (5, 'message', STRING, OMIT),
    ),
    'apps/v1.ReplicaSetSpec': (
        (1, 'replicas', INT32, POINTER),
        (4, 'minReadySeconds', INT32, OMIT),
        (2, 'selector', 'meta/v1.LabelSelector', POINTER_OR_NULL),
        (3, 'template', 'core/v1.PodTemplateSpec', ALWAYS),
    ),
    'apps/v1.ReplicaSetStatus': (
        (1, 'replicas', INT32, ALWAYS),
        (2, 'fullyLabeledReplicas', INT32, OMIT),
        (4, 'readyReplicas', INT32, OMIT),
        (5, 'availableReplicas', INT32, OMIT),
        (3, 'observedGeneration', INT64, OMIT),
        (6, 'conditions', Repeated('apps/v1.ReplicaSetCondition'), OMIT),
    ),
    'apps/v1.RollingUpdateDaemonSet': (
        (1, 'maxUnavailable', INT_OR_STRING, POINTER),
        (2, 'maxSurge', INT_OR_STRING, POINTER),
    ),
    'apps/v1.RollingUpdateDeployment': (
        (1, 'maxUnavailable', INT_OR_STRING, POINTER),
        (2, 'maxSurge', INT_OR_STRING, POINTER),
    ),
    'apps/v1.RollingUpdateStatefulSetStrategy': (
        (1, 'partition', INT32, POINTER),
        (2, 'maxUnavailable', INT_OR_STRING, POINTER),
    ),
    'apps/v1.StatefulSet': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'apps/v1.StatefulSetSpec', ALWAYS),
        (3, 'status', 'apps/v1.StatefulSetStatus', ALWAYS),
    ),
    'apps/v1.StatefulSetCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (3, 'lastTransitionTime', TIME, ALWAYS),
        (4, 'reason', STRING, OMIT),
        (5, 'message', STRING, OMIT),
    ),
    'apps/v1.StatefulSetOrdinals': (
        (1, 'start', INT32, ALWAYS),
    ),
    'apps/v1.StatefulSetPersistentVolumeClaimRetentionPolicy': (
        (1, 'whenDeleted', STRING, OMIT),
        (2, 'whenScaled', STRING, OMIT),
    ),
    'apps/v1.StatefulSetSpec': (
        (1, 'replicas', INT32, POINTER),
        (2, 'selector', 'meta/v1.LabelSelector', POINTER_OR_NULL),
        (3, 'template', 'core/v1.PodTemplateSpec', ALWAYS),
        (4, 'volumeClaimTemplates', Repeated('core/v1.PersistentVolumeClaim'), OMIT),
        (5, 'serviceName', STRING, ALWAYS),
        (6, 'podManagementPolicy', STRING, OMIT),
        (7, 'updateStrategy', 'apps/v1.StatefulSetUpdateStrategy', ALWAYS),
        (8, 'revisionHistoryLimit', INT32, POINTER),
        (9, 'minReadySeconds', INT32, OMIT),
        (10, 'persistentVolumeClaimRetentionPolicy', 'apps/v1.StatefulSetPersistentVolumeClaimRetentionPolicy', POINTER),
        (11, 'ordinals', 'apps/v1.StatefulSetOrdinals', POINTER),
    ),
    'apps/v1.StatefulSetStatus': (
        (1, 'observedGeneration', INT64, OMIT),
        (2, 'replicas', INT32, ALWAYS),
        (3, 'readyReplicas', INT32, OMIT),
        (4, 'currentReplicas', INT32, OMIT),
        (5, 'updatedReplicas', INT32, OMIT),
        (6, 'currentRevision', STRING, OMIT),
        (7, 'updateRevision', STRING, OMIT),
        (9, 'collisionCount', INT32, POINTER),
        (10, 'conditions', Repeated('apps/v1.StatefulSetCondition'), OMIT),
        (11, 'availableReplicas', INT32, ALWAYS),
    ),
    'apps/v1.StatefulSetUpdateStrategy': (
        (1, 'type', STRING, OMIT),
        (2, 'rollingUpdate', 'apps/v1.RollingUpdateStatefulSetStrategy', POINTER),
    ),
    'authentication/v1.BoundObjectReference': (
        (1, 'kind', STRING, OMIT),
        (2, 'apiVersion', STRING, OMIT),
        (3, 'name', STRING, OMIT),
        (4, 'uid', STRING, OMIT),
    ),
    'authentication/v1.TokenRequest': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'authentication/v1.TokenRequestSpec', ALWAYS),
        (3, 'status', 'authentication/v1.TokenRequestStatus', ALWAYS),
    ),
    'authentication/v1.TokenRequestSpec': (
        (1, 'audiences', Repeated(STRING), ALWAYS),
        (4, 'expirationSeconds', INT64, POINTER_OR_NULL),
        (3, 'boundObjectRef', 'authentication/v1.BoundObjectReference', POINTER_OR_NULL),
    ),
    'authentication/v1.TokenRequestStatus': (
        (1, 'token', STRING, OMIT),
        (2, 'expirationTimestamp', TIME, ALWAYS),
    ),
    'autoscaling/v1.CrossVersionObjectReference': (
        (1, 'kind', STRING, ALWAYS),
        (2, 'name', STRING, ALWAYS),
        (3, 'apiVersion', STRING, OMIT),
    ),
    'autoscaling/v1.HorizontalPodAutoscaler': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'autoscaling/v1.HorizontalPodAutoscalerSpec', ALWAYS),
        (3, 'status', 'autoscaling/v1.HorizontalPodAutoscalerStatus', ALWAYS),
    ),
    'autoscaling/v1.HorizontalPodAutoscalerSpec': (
        (1, 'scaleTargetRef', 'autoscaling/v1.CrossVersionObjectReference', ALWAYS),
        (2, 'minReplicas', INT32, POINTER),
        (3, 'maxReplicas', INT32, ALWAYS),
        (4, 'targetCPUUtilizationPercentage', INT32, POINTER),
    ),
    'autoscaling/v1.HorizontalPodAutoscalerStatus': (
        (1, 'observedGeneration', INT64, POINTER),
        (2, 'lastScaleTime', TIME, POINTER),
        (3, 'currentReplicas', INT32, ALWAYS),
        (4, 'desiredReplicas', INT32, ALWAYS),
        (5, 'currentCPUUtilizationPercentage', INT32, POINTER),
    ),
    'autoscaling/v1.Scale': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'autoscaling/v1.ScaleSpec', ALWAYS),
        (3, 'status', 'autoscaling/v1.ScaleStatus', ALWAYS),
    ),
    'autoscaling/v1.ScaleSpec': (
        (1, 'replicas', INT32, OMIT),
    ),
    'autoscaling/v1.ScaleStatus': (
        (1, 'replicas', INT32, ALWAYS),
        (2, 'selector', STRING, OMIT),
    ),
    'autoscaling/v2.ContainerResourceMetricSource': (
        (1, 'name', STRING, ALWAYS),
        (2, 'target', 'autoscaling/v2.MetricTarget', ALWAYS),
        (3, 'container', STRING, ALWAYS),
    ),
    'autoscaling/v2.ContainerResourceMetricStatus': (
        (1, 'name', STRING, ALWAYS),
        (2, 'current', 'autoscaling/v2.MetricValueStatus', ALWAYS),
        (3, 'container', STRING, ALWAYS),
    ),
    'autoscaling/v2.CrossVersionObjectReference': (
        (1, 'kind', STRING, ALWAYS),
        (2, 'name', STRING, ALWAYS),
        (3, 'apiVersion', STRING, OMIT),
    ),
    'autoscaling/v2.ExternalMetricSource': (
        (1, 'metric', 'autoscaling/v2.MetricIdentifier', ALWAYS),
        (2, 'target', 'autoscaling/v2.MetricTarget', ALWAYS),
    ),
    'autoscaling/v2.ExternalMetricStatus': (
        (1, 'metric', 'autoscaling/v2.MetricIdentifier', ALWAYS),
        (2, 'current', 'autoscaling/v2.MetricValueStatus', ALWAYS),
    ),
    'autoscaling/v2.HPAScalingPolicy': (
        (1, 'type', STRING, ALWAYS),
        (2, 'value', INT32, ALWAYS),
        (3, 'periodSeconds', INT32, ALWAYS),
    ),
    'autoscaling/v2.HPAScalingRules': (
        (3, 'stabilizationWindowSeconds', INT32, POINTER),
        (1, 'selectPolicy', STRING, POINTER),
        (2, 'policies', Repeated('autoscaling/v2.HPAScalingPolicy'), OMIT),
    ),
    'autoscaling/v2.HorizontalPodAutoscaler': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'autoscaling/v2.HorizontalPodAutoscalerSpec', ALWAYS),
        (3, 'status', 'autoscaling/v2.HorizontalPodAutoscalerStatus', ALWAYS),
    ),
    'autoscaling/v2.HorizontalPodAutoscalerBehavior': (
        (1, 'scaleUp', 'autoscaling/v2.HPAScalingRules', POINTER),
        (2, 'scaleDown', 'autoscaling/v2.HPAScalingRules', POINTER),
    ),
    'autoscaling/v2.HorizontalPodAutoscalerCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (3, 'lastTransitionTime', TIME, ALWAYS),
        (4, 'reason', STRING, OMIT),
        (5, 'message', STRING, OMIT),
    ),
    'autoscaling/v2.HorizontalPodAutoscalerSpec': (
        (1, 'scaleTargetRef', 'autoscaling/v2.CrossVersionObjectReference', ALWAYS),
        (2, 'minReplicas', INT32, POINTER),
        (3, 'maxReplicas', INT32, ALWAYS),
        (4, 'metrics', Repeated('autoscaling/v2.MetricSpec'), OMIT),
        (5, 'behavior', 'autoscaling/v2.HorizontalPodAutoscalerBehavior', POINTER),
    ),
    'autoscaling/v2.HorizontalPodAutoscalerStatus': (
        (1, 'observedGeneration', INT64, POINTER),
        (2, 'lastScaleTime', TIME, POINTER),
        (3, 'currentReplicas', INT32, OMIT),
        (4, 'desiredReplicas', INT32, ALWAYS),
        (5, 'currentMetrics', Repeated('autoscaling/v2.MetricStatus'), ALWAYS),
        (6, 'conditions', Repeated('autoscaling/v2.HorizontalPodAutoscalerCondition'), OMIT),
    ),
    'autoscaling/v2.MetricIdentifier': (
        (1, 'name', STRING, ALWAYS),
        (2, 'selector', 'meta/v1.LabelSelector', POINTER),
    ),
    'autoscaling/v2.MetricSpec': (
        (1, 'type', STRING, ALWAYS),
        (2, 'object', 'autoscaling/v2.ObjectMetricSource', POINTER),
        (3, 'pods', 'autoscaling/v2.PodsMetricSource', POINTER),
        (4, 'resource', 'autoscaling/v2.ResourceMetricSource', POINTER),
        (7, 'containerResource', 'autoscaling/v2.ContainerResourceMetricSource', POINTER),
        (5, 'external', 'autoscaling/v2.ExternalMetricSource', POINTER),
    ),
    'autoscaling/v2.MetricStatus': (
        (1, 'type', STRING, ALWAYS),
        (2, 'object', 'autoscaling/v2.ObjectMetricStatus', POINTER),
        (3, 'pods', 'autoscaling/v2.PodsMetricStatus', POINTER),
        (4, 'resource', 'autoscaling/v2.ResourceMetricStatus', POINTER),
        (7, 'containerResource', 'autoscaling/v2.ContainerResourceMetricStatus', POINTER),
        (5, 'external', 'autoscaling/v2.ExternalMetricStatus', POINTER),
    ),
    'autoscaling/v2.MetricTarget': (
        (1, 'type', STRING, ALWAYS),
        (2, 'value', QUANTITY, POINTER),
        (3, 'averageValue', QUANTITY, POINTER),
        (4, 'averageUtilization', INT32, POINTER),
    ),
    'autoscaling/v2.MetricValueStatus': (
        (1, 'value', QUANTITY, POINTER),
        (2, 'averageValue', QUANTITY, POINTER),
        (3, 'averageUtilization', INT32, POINTER),
    ),
    'autoscaling/v2.ObjectMetricSource': (
        (1, 'describedObject', 'autoscaling/v2.CrossVersionObjectReference', ALWAYS),
        (2, 'target', 'autoscaling/v2.MetricTarget', ALWAYS),
        (3, 'metric', 'autoscaling/v2.MetricIdentifier', ALWAYS),
    ),
    'autoscaling/v2.ObjectMetricStatus': (
        (1, 'metric', 'autoscaling/v2.MetricIdentifier', ALWAYS),
        (2, 'current', 'autoscaling/v2.MetricValueStatus', ALWAYS),
        (3, 'describedObject', 'autoscaling/v2.CrossVersionObjectReference', ALWAYS),
    ),
    'autoscaling/v2.PodsMetricSource': (
        (1, 'metric', 'autoscaling/v2.MetricIdentifier', ALWAYS),
        (2, 'target', 'autoscaling/v2.MetricTarget', ALWAYS),
    ),
    'autoscaling/v2.PodsMetricStatus': (
        (1, 'metric', 'autoscaling/v2.MetricIdentifier', ALWAYS),
        (2, 'current', 'autoscaling/v2.MetricValueStatus', ALWAYS),
    ),
    'autoscaling/v2.ResourceMetricSource': (
        (1, 'name', STRING, ALWAYS),
        (2, 'target', 'autoscaling/v2.MetricTarget', ALWAYS),
    ),
    'autoscaling/v2.ResourceMetricStatus': (
        (1, 'name', STRING, ALWAYS),
        (2, 'current', 'autoscaling/v2.MetricValueStatus', ALWAYS),
    ),
    'batch/v1.CronJob': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'batch/v1.CronJobSpec', ALWAYS),
        (3, 'status', 'batch/v1.CronJobStatus', ALWAYS),
    ),
    'batch/v1.CronJobSpec': (
        (1, 'schedule', STRING, ALWAYS),
        (8, 'timeZone', STRING, POINTER),
        (2, 'startingDeadlineSeconds', INT64, POINTER),
        (3, 'concurrencyPolicy', STRING, OMIT),
        (4, 'suspend', BOOL, POINTER),
        (5, 'jobTemplate', 'batch/v1.JobTemplateSpec', ALWAYS),
        (6, 'successfulJobsHistoryLimit', INT32, POINTER),
        (7, 'failedJobsHistoryLimit', INT32, POINTER),
    ),
    'batch/v1.CronJobStatus': (
        (1, 'active', Repeated('core/v1.ObjectReference'), OMIT),
        (4, 'lastScheduleTime', TIME, POINTER),
        (5, 'lastSuccessfulTime', TIME, POINTER),
    ),
    'batch/v1.Job': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'batch/v1.JobSpec', ALWAYS),
        (3, 'status', 'batch/v1.JobStatus', ALWAYS),
    ),
    'batch/v1.JobCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (3, 'lastProbeTime', TIME, ALWAYS),
        (4, 'lastTransitionTime', TIME, ALWAYS),
        (5, 'reason', STRING, OMIT),
        (6, 'message', STRING, OMIT),
    ),
    'batch/v1.JobSpec': (
        (1, 'parallelism', INT32, POINTER),
        (2, 'completions', INT32, POINTER),
        (3, 'activeDeadlineSeconds', INT64, POINTER),
        (11, 'podFailurePolicy', 'batch/v1.PodFailurePolicy', POINTER),
        (16, 'successPolicy', 'batch/v1.SuccessPolicy', POINTER),
        (7, 'backoffLimit', INT32, POINTER),
        (12, 'backoffLimitPerIndex', INT32, POINTER),
        (13, 'maxFailedIndexes', INT32, POINTER),
        (4, 'selector', 'meta/v1.LabelSelector', POINTER),
        (5, 'manualSelector', BOOL, POINTER),
        (6, 'template', 'core/v1.PodTemplateSpec', ALWAYS),
        (8, 'ttlSecondsAfterFinished', INT32, POINTER),
        (9, 'completionMode', STRING, POINTER),
        (10, 'suspend', BOOL, POINTER),
        (14, 'podReplacementPolicy', STRING, POINTER),
        (15, 'managedBy', STRING, POINTER),
    ),
    'batch/v1.JobStatus': (
        (1, 'conditions', Repeated('batch/v1.JobCondition'), OMIT),
        (2, 'startTime', TIME, POINTER),
        (3, 'completionTime', TIME, POINTER),
        (4, 'active', INT32, OMIT),
        (5, 'succeeded', INT32, OMIT),
        (6, 'failed', INT32, OMIT),
        (11, 'terminating', INT32, POINTER),
        (7, 'completedIndexes', STRING, OMIT),
        (10, 'failedIndexes', STRING, POINTER),
        (8, 'uncountedTerminatedPods', 'batch/v1.UncountedTerminatedPods', POINTER),
        (9, 'ready', INT32, POINTER),
    ),
    'batch/v1.JobTemplateSpec': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'batch/v1.JobSpec', ALWAYS),
    ),
    'batch/v1.PodFailurePolicy': (
        (1, 'rules', Repeated('batch/v1.PodFailurePolicyRule'), ALWAYS),
    ),
    'batch/v1.PodFailurePolicyOnExitCodesRequirement': (
        (1, 'containerName', STRING, POINTER),
        (2, 'operator', STRING, ALWAYS),
        (3, 'values', Repeated(INT32), ALWAYS),
    ),
    'batch/v1.PodFailurePolicyOnPodConditionsPattern': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
    ),
    'batch/v1.PodFailurePolicyRule': (
        (1, 'action', STRING, ALWAYS),
        (2, 'onExitCodes', 'batch/v1.PodFailurePolicyOnExitCodesRequirement', POINTER),
        (3, 'onPodConditions', Repeated('batch/v1.PodFailurePolicyOnPodConditionsPattern'), OMIT),
    ),
    'batch/v1.SuccessPolicy': (
        (1, 'rules', Repeated('batch/v1.SuccessPolicyRule'), ALWAYS),
    ),
    'batch/v1.SuccessPolicyRule': (
        (1, 'succeededIndexes', STRING, POINTER),
        (2, 'succeededCount', INT32, POINTER),
    ),
    'batch/v1.UncountedTerminatedPods': (
        (1, 'succeeded', Repeated(STRING), OMIT),
        (2, 'failed', Repeated(STRING), OMIT),
    ),
    'coordination/v1.Lease': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'coordination/v1.LeaseSpec', ALWAYS),
    ),
    'coordination/v1.LeaseSpec': (
        (1, 'holderIdentity', STRING, POINTER),
        (2, 'leaseDurationSeconds', INT32, POINTER),
        (3, 'acquireTime', MICROTIME, POINTER),
        (4, 'renewTime', MICROTIME, POINTER),
        (5, 'leaseTransitions', INT32, POINTER),
        (6, 'strategy', STRING, POINTER),
        (7, 'preferredHolder', STRING, POINTER),
    ),
    'core/v1.AWSElasticBlockStoreVolumeSource': (
        (1, 'volumeID', STRING, ALWAYS),
        (2, 'fsType', STRING, OMIT),
        (3, 'partition', INT32, OMIT),
        (4, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.Affinity': (
        (1, 'nodeAffinity', 'core/v1.NodeAffinity', POINTER),
        (2, 'podAffinity', 'core/v1.PodAffinity', POINTER),
        (3, 'podAntiAffinity', 'core/v1.PodAntiAffinity', POINTER),
    ),
    'core/v1.AppArmorProfile': (
        (1, 'type', STRING, ALWAYS),
        (2, 'localhostProfile', STRING, POINTER),
    ),
    'core/v1.AzureDiskVolumeSource': (
        (1, 'diskName', STRING, ALWAYS),
        (2, 'diskURI', STRING, ALWAYS),
        (3, 'cachingMode', STRING, POINTER),
        (4, 'fsType', STRING, POINTER),
        (5, 'readOnly', BOOL, POINTER),
        (6, 'kind', STRING, POINTER),
    ),
    'core/v1.AzureFileVolumeSource': (
        (1, 'secretName', STRING, ALWAYS),
        (2, 'shareName', STRING, ALWAYS),
        (3, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.Binding': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'target', 'core/v1.ObjectReference', ALWAYS),
    ),
    'core/v1.CSIVolumeSource': (
        (1, 'driver', STRING, ALWAYS),
        (2, 'readOnly', BOOL, POINTER),
        (3, 'fsType', STRING, POINTER),
        (4, 'volumeAttributes', Map(STRING), OMIT),
        (5, 'nodePublishSecretRef', 'core/v1.LocalObjectReference', POINTER),
    ),
    'core/v1.Capabilities': (
        (1, 'add', Repeated(STRING), OMIT),
        (2, 'drop', Repeated(STRING), OMIT),
    ),
    'core/v1.CephFSVolumeSource': (
        (1, 'monitors', Repeated(STRING), ALWAYS),
        (2, 'path', STRING, OMIT),
        (3, 'user', STRING, OMIT),
        (4, 'secretFile', STRING, OMIT),
        (5, 'secretRef', 'core/v1.LocalObjectReference', POINTER),
        (6, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.CinderVolumeSource': (
        (1, 'volumeID', STRING, ALWAYS),
        (2, 'fsType', STRING, OMIT),
        (3, 'readOnly', BOOL, OMIT),
        (4, 'secretRef', 'core/v1.LocalObjectReference', POINTER),
    ),
    'core/v1.ClientIPConfig': (
        (1, 'timeoutSeconds', INT32, POINTER),
    ),
    'core/v1.ClusterTrustBundleProjection': (
        (1, 'name', STRING, POINTER),
        (2, 'signerName', STRING, POINTER),
        (3, 'labelSelector', 'meta/v1.LabelSelector', POINTER),
        (5, 'optional', BOOL, POINTER),
        (4, 'path', STRING, ALWAYS),
    ),
    'core/v1.ConfigMap': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (4, 'immutable', BOOL, POINTER),
        (2, 'data', Map(STRING), OMIT),
        (3, 'binaryData', Map(BYTES), OMIT),
    ),
    'core/v1.ConfigMapEnvSource': (
        (1, '', 'core/v1.LocalObjectReference', INLINE),
        (2, 'optional', BOOL, POINTER),
    ),
    'core/v1.ConfigMapKeySelector': (
        (1, '', 'core/v1.LocalObjectReference', INLINE),
        (2, 'key', STRING, ALWAYS),
        (3, 'optional', BOOL, POINTER),
    ),
    'core/v1.ConfigMapProjection': (
        (1, '', 'core/v1.LocalObjectReference', INLINE),
        (2, 'items', Repeated('core/v1.KeyToPath'), OMIT),
        (4, 'optional', BOOL, POINTER),
    ),
    'core/v1.ConfigMapVolumeSource': (
        (1, '', 'core/v1.LocalObjectReference', INLINE),
        (2, 'items', Repeated('core/v1.KeyToPath'), OMIT),
        (3, 'defaultMode', INT32, POINTER),
        (4, 'optional', BOOL, POINTER),
    ),
    'core/v1.Container': (
        (1, 'name', STRING, ALWAYS),
        (2, 'image', STRING, OMIT),
        (3, 'command', Repeated(STRING), OMIT),
        (4, 'args', Repeated(STRING), OMIT),
        (5, 'workingDir', STRING, OMIT),
        (6, 'ports', Repeated('core/v1.ContainerPort'), OMIT),
        (19, 'envFrom', Repeated('core/v1.EnvFromSource'), OMIT),
        (7, 'env', Repeated('core/v1.EnvVar'), OMIT),
        (8, 'resources', 'core/v1.ResourceRequirements', ALWAYS),
        (23, 'resizePolicy', Repeated('core/v1.ContainerResizePolicy'), OMIT),
        (24, 'restartPolicy', STRING, POINTER),
        (25, 'restartPolicyRules', Repeated('core/v1.ContainerRestartRule'), OMIT),  # 1.34+
        (9, 'volumeMounts', Repeated('core/v1.VolumeMount'), OMIT),
        (21, 'volumeDevices', Repeated('core/v1.VolumeDevice'), OMIT),
        (10, 'livenessProbe', 'core/v1.Probe', POINTER),
        (11, 'readinessProbe', 'core/v1.Probe', POINTER),
        (22, 'startupProbe', 'core/v1.Probe', POINTER),
        (12, 'lifecycle', 'core/v1.Lifecycle', POINTER),
        (13, 'terminationMessagePath', STRING, OMIT),
        (20, 'terminationMessagePolicy', STRING, OMIT),
        (14, 'imagePullPolicy', STRING, OMIT),
        (15, 'securityContext', 'core/v1.SecurityContext', POINTER),
        (16, 'stdin', BOOL, OMIT),
        (17, 'stdinOnce', BOOL, OMIT),
        (18, 'tty', BOOL, OMIT),
    ),
    'core/v1.ContainerPort': (
        (1, 'name', STRING, OMIT),
        (2, 'hostPort', INT32, OMIT),
        (3, 'containerPort', INT32, ALWAYS),
        (4, 'protocol', STRING, OMIT),
        (5, 'hostIP', STRING, OMIT),
    ),
    'core/v1.ContainerResizePolicy': (
        (1, 'resourceName', STRING, ALWAYS),
        (2, 'restartPolicy', STRING, ALWAYS),
    ),
    # Fields marked 1.33+/1.34+ and the messages ContainerRestartRule*, FileKeySelector postdate
    # kubectl 1.32's descriptors; their numbers and json tags come from kubectl 1.37's struct tags.
    'core/v1.ContainerRestartRule': (
        (1, 'action', STRING, OMIT),
        (2, 'exitCodes', 'core/v1.ContainerRestartRuleOnExitCodes', POINTER),
    ),
    'core/v1.ContainerRestartRuleOnExitCodes': (
        (1, 'operator', STRING, OMIT),
        (2, 'values', Repeated(INT32), OMIT),
    ),
    'core/v1.ContainerState': (
        (1, 'waiting', 'core/v1.ContainerStateWaiting', POINTER),
        (2, 'running', 'core/v1.ContainerStateRunning', POINTER),
        (3, 'terminated', 'core/v1.ContainerStateTerminated', POINTER),
    ),
    'core/v1.ContainerStateRunning': (
        (1, 'startedAt', TIME, ALWAYS),
    ),
    'core/v1.ContainerStateTerminated': (
        (1, 'exitCode', INT32, ALWAYS),
        (2, 'signal', INT32, OMIT),
        (3, 'reason', STRING, OMIT),
        (4, 'message', STRING, OMIT),
        (5, 'startedAt', TIME, ALWAYS),
        (6, 'finishedAt', TIME, ALWAYS),
        (7, 'containerID', STRING, OMIT),
    ),
    'core/v1.ContainerStateWaiting': (
        (1, 'reason', STRING, OMIT),
        (2, 'message', STRING, OMIT),
    ),
    'core/v1.ContainerStatus': (
        (1, 'name', STRING, ALWAYS),
        (2, 'state', 'core/v1.ContainerState', ALWAYS),
        (3, 'lastState', 'core/v1.ContainerState', ALWAYS),
        (4, 'ready', BOOL, ALWAYS),
        (5, 'restartCount', INT32, ALWAYS),
        (6, 'image', STRING, ALWAYS),
        (7, 'imageID', STRING, ALWAYS),
        (8, 'containerID', STRING, OMIT),
        (9, 'started', BOOL, POINTER),
        (10, 'allocatedResources', Map(QUANTITY), OMIT),
        (11, 'resources', 'core/v1.ResourceRequirements', POINTER),
        (12, 'volumeMounts', Repeated('core/v1.VolumeMountStatus'), OMIT),
        (13, 'user', 'core/v1.ContainerUser', POINTER),
        (14, 'allocatedResourcesStatus', Repeated('core/v1.ResourceStatus'), OMIT),
    ),
    'core/v1.ContainerUser': (
        (1, 'linux', 'core/v1.LinuxContainerUser', POINTER),
    ),
    'core/v1.DownwardAPIProjection': (
        (1, 'items', Repeated('core/v1.DownwardAPIVolumeFile'), OMIT),
    ),
    'core/v1.DownwardAPIVolumeFile': (
        (1, 'path', STRING, ALWAYS),
        (2, 'fieldRef', 'core/v1.ObjectFieldSelector', POINTER),
        (3, 'resourceFieldRef', 'core/v1.ResourceFieldSelector', POINTER),
        (4, 'mode', INT32, POINTER),
    ),
    'core/v1.DownwardAPIVolumeSource': (
        (1, 'items', Repeated('core/v1.DownwardAPIVolumeFile'), OMIT),
        (2, 'defaultMode', INT32, POINTER),
    ),
    'core/v1.EmptyDirVolumeSource': (
        (1, 'medium', STRING, OMIT),
        (2, 'sizeLimit', QUANTITY, POINTER),
    ),
    'core/v1.EndpointAddress': (
        (1, 'ip', STRING, ALWAYS),
        (3, 'hostname', STRING, OMIT),
        (4, 'nodeName', STRING, POINTER),
        (2, 'targetRef', 'core/v1.ObjectReference', POINTER),
    ),
    'core/v1.EndpointPort': (
        (1, 'name', STRING, OMIT),
        (2, 'port', INT32, ALWAYS),
        (3, 'protocol', STRING, OMIT),
        (4, 'appProtocol', STRING, POINTER),
    ),
    'core/v1.EndpointSubset': (
        (1, 'addresses', Repeated('core/v1.EndpointAddress'), OMIT),
        (2, 'notReadyAddresses', Repeated('core/v1.EndpointAddress'), OMIT),
        (3, 'ports', Repeated('core/v1.EndpointPort'), OMIT),
    ),
    'core/v1.Endpoints': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'subsets', Repeated('core/v1.EndpointSubset'), OMIT),
    ),
    'core/v1.EnvFromSource': (
        (1, 'prefix', STRING, OMIT),
        (2, 'configMapRef', 'core/v1.ConfigMapEnvSource', POINTER),
        (3, 'secretRef', 'core/v1.SecretEnvSource', POINTER),
    ),
    'core/v1.EnvVar': (
        (1, 'name', STRING, ALWAYS),
        (2, 'value', STRING, OMIT),
        (3, 'valueFrom', 'core/v1.EnvVarSource', POINTER),
    ),
    'core/v1.EnvVarSource': (
        (1, 'fieldRef', 'core/v1.ObjectFieldSelector', POINTER),
        (2, 'resourceFieldRef', 'core/v1.ResourceFieldSelector', POINTER),
        (3, 'configMapKeyRef', 'core/v1.ConfigMapKeySelector', POINTER),
        (4, 'secretKeyRef', 'core/v1.SecretKeySelector', POINTER),
        (5, 'fileKeyRef', 'core/v1.FileKeySelector', POINTER),  # 1.34+
    ),
    'core/v1.EphemeralContainer': (
        (1, '', 'core/v1.EphemeralContainerCommon', INLINE),
        (2, 'targetContainerName', STRING, OMIT),
    ),
    'core/v1.EphemeralContainerCommon': (
        (1, 'name', STRING, ALWAYS),
        (2, 'image', STRING, OMIT),
        (3, 'command', Repeated(STRING), OMIT),
        (4, 'args', Repeated(STRING), OMIT),
        (5, 'workingDir', STRING, OMIT),
        (6, 'ports', Repeated('core/v1.ContainerPort'), OMIT),
        (19, 'envFrom', Repeated('core/v1.EnvFromSource'), OMIT),
        (7, 'env', Repeated('core/v1.EnvVar'), OMIT),
        (8, 'resources', 'core/v1.ResourceRequirements', ALWAYS),
        (23, 'resizePolicy', Repeated('core/v1.ContainerResizePolicy'), OMIT),
        (24, 'restartPolicy', STRING, POINTER),
        (25, 'restartPolicyRules', Repeated('core/v1.ContainerRestartRule'), OMIT),  # 1.34+
        (9, 'volumeMounts', Repeated('core/v1.VolumeMount'), OMIT),
        (21, 'volumeDevices', Repeated('core/v1.VolumeDevice'), OMIT),
        (10, 'livenessProbe', 'core/v1.Probe', POINTER),
        (11, 'readinessProbe', 'core/v1.Probe', POINTER),
        (22, 'startupProbe', 'core/v1.Probe', POINTER),
        (12, 'lifecycle', 'core/v1.Lifecycle', POINTER),
        (13, 'terminationMessagePath', STRING, OMIT),
        (20, 'terminationMessagePolicy', STRING, OMIT),
        (14, 'imagePullPolicy', STRING, OMIT),
        (15, 'securityContext', 'core/v1.SecurityContext', POINTER),
        (16, 'stdin', BOOL, OMIT),
        (17, 'stdinOnce', BOOL, OMIT),
        (18, 'tty', BOOL, OMIT),
    ),
    'core/v1.EphemeralVolumeSource': (
        (1, 'volumeClaimTemplate', 'core/v1.PersistentVolumeClaimTemplate', POINTER),
    ),
    'core/v1.ExecAction': (
        (1, 'command', Repeated(STRING), OMIT),
    ),
    'core/v1.FCVolumeSource': (
        (1, 'targetWWNs', Repeated(STRING), OMIT),
        (2, 'lun', INT32, POINTER),
        (3, 'fsType', STRING, OMIT),
        (4, 'readOnly', BOOL, OMIT),
        (5, 'wwids', Repeated(STRING), OMIT),
    ),
    'core/v1.FileKeySelector': (
        (1, 'volumeName', STRING, ALWAYS),
        (2, 'path', STRING, ALWAYS),
        (3, 'key', STRING, ALWAYS),
        (4, 'optional', BOOL, POINTER),
    ),
    'core/v1.FlexVolumeSource': (
        (1, 'driver', STRING, ALWAYS),
        (2, 'fsType', STRING, OMIT),
        (3, 'secretRef', 'core/v1.LocalObjectReference', POINTER),
        (4, 'readOnly', BOOL, OMIT),
        (5, 'options', Map(STRING), OMIT),
    ),
    'core/v1.FlockerVolumeSource': (
        (1, 'datasetName', STRING, OMIT),
        (2, 'datasetUUID', STRING, OMIT),
    ),
    'core/v1.GCEPersistentDiskVolumeSource': (
        (1, 'pdName', STRING, ALWAYS),
        (2, 'fsType', STRING, OMIT),
        (3, 'partition', INT32, OMIT),
        (4, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.GRPCAction': (
        (1, 'port', INT32, ALWAYS),
        (2, 'service', STRING, POINTER_OR_NULL),
    ),
    'core/v1.GitRepoVolumeSource': (
        (1, 'repository', STRING, ALWAYS),
        (2, 'revision', STRING, OMIT),
        (3, 'directory', STRING, OMIT),
    ),
    'core/v1.GlusterfsVolumeSource': (
        (1, 'endpoints', STRING, ALWAYS),
        (2, 'path', STRING, ALWAYS),
        (3, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.HTTPGetAction': (
        (1, 'path', STRING, OMIT),
        (2, 'port', INT_OR_STRING, ALWAYS),
        (3, 'host', STRING, OMIT),
        (4, 'scheme', STRING, OMIT),
        (5, 'httpHeaders', Repeated('core/v1.HTTPHeader'), OMIT),
    ),
    'core/v1.HTTPHeader': (
        (1, 'name', STRING, ALWAYS),
        (2, 'value', STRING, ALWAYS),
    ),
    'core/v1.HostAlias': (
        (1, 'ip', STRING, ALWAYS),
        (2, 'hostnames', Repeated(STRING), OMIT),
    ),
    'core/v1.HostIP': (
        (1, 'ip', STRING, ALWAYS),
    ),
    'core/v1.HostPathVolumeSource': (
        (1, 'path', STRING, ALWAYS),
        (2, 'type', STRING, POINTER),
    ),
    'core/v1.ISCSIVolumeSource': (
        (1, 'targetPortal', STRING, ALWAYS),
        (2, 'iqn', STRING, ALWAYS),
        (3, 'lun', INT32, ALWAYS),
        (4, 'iscsiInterface', STRING, OMIT),
        (5, 'fsType', STRING, OMIT),
        (6, 'readOnly', BOOL, OMIT),
        (7, 'portals', Repeated(STRING), OMIT),
        (8, 'chapAuthDiscovery', BOOL, OMIT),
        (11, 'chapAuthSession', BOOL, OMIT),
        (10, 'secretRef', 'core/v1.LocalObjectReference', POINTER),
        (12, 'initiatorName', STRING, POINTER),
    ),
    'core/v1.ImageVolumeSource': (
        (1, 'reference', STRING, OMIT),
        (2, 'pullPolicy', STRING, OMIT),
    ),
    'core/v1.KeyToPath': (
        (1, 'key', STRING, ALWAYS),
        (2, 'path', STRING, ALWAYS),
        (3, 'mode', INT32, POINTER),
    ),
    'core/v1.Lifecycle': (
        (1, 'postStart', 'core/v1.LifecycleHandler', POINTER),
        (2, 'preStop', 'core/v1.LifecycleHandler', POINTER),
        (3, 'stopSignal', STRING, POINTER),  # 1.33+
    ),
    'core/v1.LifecycleHandler': (
        (1, 'exec', 'core/v1.ExecAction', POINTER),
        (2, 'httpGet', 'core/v1.HTTPGetAction', POINTER),
        (3, 'tcpSocket', 'core/v1.TCPSocketAction', POINTER),
        (4, 'sleep', 'core/v1.SleepAction', POINTER),
    ),
    'core/v1.LimitRange': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'core/v1.LimitRangeSpec', ALWAYS),
    ),
    'core/v1.LimitRangeItem': (
        (1, 'type', STRING, ALWAYS),
        (2, 'max', Map(QUANTITY), OMIT),
        (3, 'min', Map(QUANTITY), OMIT),
        (4, 'default', Map(QUANTITY), OMIT),
        (5, 'defaultRequest', Map(QUANTITY), OMIT),
        (6, 'maxLimitRequestRatio', Map(QUANTITY), OMIT),
    ),
    'core/v1.LimitRangeSpec': (
        (1, 'limits', Repeated('core/v1.LimitRangeItem'), ALWAYS),
    ),
    'core/v1.LinuxContainerUser': (
        (1, 'uid', INT64, ALWAYS),
        (2, 'gid', INT64, ALWAYS),
        (3, 'supplementalGroups', Repeated(INT64), OMIT),
    ),
    'core/v1.LoadBalancerIngress': (
        (1, 'ip', STRING, OMIT),
        (2, 'hostname', STRING, OMIT),
        (3, 'ipMode', STRING, POINTER),
        (4, 'ports', Repeated('core/v1.PortStatus'), OMIT),
    ),
    'core/v1.LoadBalancerStatus': (
        (1, 'ingress', Repeated('core/v1.LoadBalancerIngress'), OMIT),
    ),
    'core/v1.LocalObjectReference': (
        (1, 'name', STRING, OMIT),
    ),
    'core/v1.ModifyVolumeStatus': (
        (1, 'targetVolumeAttributesClassName', STRING, OMIT),
        (2, 'status', STRING, ALWAYS),
    ),
    'core/v1.NFSVolumeSource': (
        (1, 'server', STRING, ALWAYS),
        (2, 'path', STRING, ALWAYS),
        (3, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.Namespace': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'core/v1.NamespaceSpec', ALWAYS),
        (3, 'status', 'core/v1.NamespaceStatus', ALWAYS),
    ),
    'core/v1.NamespaceCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (4, 'lastTransitionTime', TIME, ALWAYS),
        (5, 'reason', STRING, OMIT),
        (6, 'message', STRING, OMIT),
    ),
    'core/v1.NamespaceSpec': (
        (1, 'finalizers', Repeated(STRING), OMIT),
    ),
    'core/v1.NamespaceStatus': (
        (1, 'phase', STRING, OMIT),
        (2, 'conditions', Repeated('core/v1.NamespaceCondition'), OMIT),
    ),
    'core/v1.NodeAffinity': (
        (1, 'requiredDuringSchedulingIgnoredDuringExecution', 'core/v1.NodeSelector', POINTER),
        (2, 'preferredDuringSchedulingIgnoredDuringExecution', Repeated('core/v1.PreferredSchedulingTerm'), OMIT),
    ),
    'core/v1.NodeSelector': (
        (1, 'nodeSelectorTerms', Repeated('core/v1.NodeSelectorTerm'), ALWAYS),
    ),
    'core/v1.NodeSelectorRequirement': (
        (1, 'key', STRING, ALWAYS),
        (2, 'operator', STRING, ALWAYS),
        (3, 'values', Repeated(STRING), OMIT),
    ),
    'core/v1.NodeSelectorTerm': (
        (1, 'matchExpressions', Repeated('core/v1.NodeSelectorRequirement'), OMIT),
        (2, 'matchFields', Repeated('core/v1.NodeSelectorRequirement'), OMIT),
    ),
    'core/v1.ObjectFieldSelector': (
        (1, 'apiVersion', STRING, OMIT),
        (2, 'fieldPath', STRING, ALWAYS),
    ),
    'core/v1.ObjectReference': (
        (1, 'kind', STRING, OMIT),
        (2, 'namespace', STRING, OMIT),
        (3, 'name', STRING, OMIT),
        (4, 'uid', STRING, OMIT),
        (5, 'apiVersion', STRING, OMIT),
        (6, 'resourceVersion', STRING, OMIT),
        (7, 'fieldPath', STRING, OMIT),
    ),
    'core/v1.PersistentVolumeClaim': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'core/v1.PersistentVolumeClaimSpec', ALWAYS),
        (3, 'status', 'core/v1.PersistentVolumeClaimStatus', ALWAYS),
    ),
    'core/v1.PersistentVolumeClaimCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (3, 'lastProbeTime', TIME, ALWAYS),
        (4, 'lastTransitionTime', TIME, ALWAYS),
        (5, 'reason', STRING, OMIT),
        (6, 'message', STRING, OMIT),
    ),
    'core/v1.PersistentVolumeClaimSpec': (
        (1, 'accessModes', Repeated(STRING), OMIT),
        (4, 'selector', 'meta/v1.LabelSelector', POINTER),
        (2, 'resources', 'core/v1.VolumeResourceRequirements', ALWAYS),
        (3, 'volumeName', STRING, OMIT),
        (5, 'storageClassName', STRING, POINTER),
        (6, 'volumeMode', STRING, POINTER),
        (7, 'dataSource', 'core/v1.TypedLocalObjectReference', POINTER),
        (8, 'dataSourceRef', 'core/v1.TypedObjectReference', POINTER),
        (9, 'volumeAttributesClassName', STRING, POINTER),
    ),
    'core/v1.PersistentVolumeClaimStatus': (
        (1, 'phase', STRING, OMIT),
        (2, 'accessModes', Repeated(STRING), OMIT),
        (3, 'capacity', Map(QUANTITY), OMIT),
        (4, 'conditions', Repeated('core/v1.PersistentVolumeClaimCondition'), OMIT),
        (5, 'allocatedResources', Map(QUANTITY), OMIT),
        (7, 'allocatedResourceStatuses', Map(STRING), OMIT),
        (8, 'currentVolumeAttributesClassName', STRING, POINTER),
        (9, 'modifyVolumeStatus', 'core/v1.ModifyVolumeStatus', POINTER),
    ),
    'core/v1.PersistentVolumeClaimTemplate': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'core/v1.PersistentVolumeClaimSpec', ALWAYS),
    ),
    'core/v1.PersistentVolumeClaimVolumeSource': (
        (1, 'claimName', STRING, ALWAYS),
        (2, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.PhotonPersistentDiskVolumeSource': (
        (1, 'pdID', STRING, ALWAYS),
        (2, 'fsType', STRING, OMIT),
    ),
    'core/v1.Pod': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'core/v1.PodSpec', ALWAYS),
        (3, 'status', 'core/v1.PodStatus', ALWAYS),
    ),
    'core/v1.PodAffinity': (
        (1, 'requiredDuringSchedulingIgnoredDuringExecution', Repeated('core/v1.PodAffinityTerm'), OMIT),
        (2, 'preferredDuringSchedulingIgnoredDuringExecution', Repeated('core/v1.WeightedPodAffinityTerm'), OMIT),
    ),
    'core/v1.PodAffinityTerm': (
        (1, 'labelSelector', 'meta/v1.LabelSelector', POINTER),
        (2, 'namespaces', Repeated(STRING), OMIT),
        (3, 'topologyKey', STRING, ALWAYS),
        (4, 'namespaceSelector', 'meta/v1.LabelSelector', POINTER),
        (5, 'matchLabelKeys', Repeated(STRING), OMIT),
        (6, 'mismatchLabelKeys', Repeated(STRING), OMIT),
    ),
    'core/v1.PodAntiAffinity': (
        (1, 'requiredDuringSchedulingIgnoredDuringExecution', Repeated('core/v1.PodAffinityTerm'), OMIT),
        (2, 'preferredDuringSchedulingIgnoredDuringExecution', Repeated('core/v1.WeightedPodAffinityTerm'), OMIT),
    ),
    'core/v1.PodCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (3, 'lastProbeTime', TIME, ALWAYS),
        (4, 'lastTransitionTime', TIME, ALWAYS),
        (5, 'reason', STRING, OMIT),
        (6, 'message', STRING, OMIT),
    ),
    'core/v1.PodDNSConfig': (
        (1, 'nameservers', Repeated(STRING), OMIT),
        (2, 'searches', Repeated(STRING), OMIT),
        (3, 'options', Repeated('core/v1.PodDNSConfigOption'), OMIT),
    ),
    'core/v1.PodDNSConfigOption': (
        (1, 'name', STRING, OMIT),
        (2, 'value', STRING, POINTER),
    ),
    'core/v1.PodIP': (
        (1, 'ip', STRING, ALWAYS),
    ),
    'core/v1.PodOS': (
        (1, 'name', STRING, ALWAYS),
    ),
    'core/v1.PodReadinessGate': (
        (1, 'conditionType', STRING, ALWAYS),
    ),
    'core/v1.PodResourceClaim': (
        (1, 'name', STRING, ALWAYS),
        (3, 'resourceClaimName', STRING, POINTER),
        (4, 'resourceClaimTemplateName', STRING, POINTER),
    ),
    'core/v1.PodResourceClaimStatus': (
        (1, 'name', STRING, ALWAYS),
        (2, 'resourceClaimName', STRING, POINTER),
    ),
    'core/v1.PodSchedulingGate': (
        (1, 'name', STRING, ALWAYS),
    ),
    'core/v1.PodSecurityContext': (
        (1, 'seLinuxOptions', 'core/v1.SELinuxOptions', POINTER),
        (8, 'windowsOptions', 'core/v1.WindowsSecurityContextOptions', POINTER),
        (2, 'runAsUser', INT64, POINTER),
        (6, 'runAsGroup', INT64, POINTER),
        (3, 'runAsNonRoot', BOOL, POINTER),
        (4, 'supplementalGroups', Repeated(INT64), OMIT),
        (12, 'supplementalGroupsPolicy', STRING, POINTER),
        (5, 'fsGroup', INT64, POINTER),
        (7, 'sysctls', Repeated('core/v1.Sysctl'), OMIT),
        (9, 'fsGroupChangePolicy', STRING, POINTER),
        (10, 'seccompProfile', 'core/v1.SeccompProfile', POINTER),
        (11, 'appArmorProfile', 'core/v1.AppArmorProfile', POINTER),
        (13, 'seLinuxChangePolicy', STRING, POINTER),
    ),
    'core/v1.PodSpec': (
        (1, 'volumes', Repeated('core/v1.Volume'), OMIT),
        (20, 'initContainers', Repeated('core/v1.Container'), OMIT),
        (2, 'containers', Repeated('core/v1.Container'), ALWAYS),
        (34, 'ephemeralContainers', Repeated('core/v1.EphemeralContainer'), OMIT),
        (3, 'restartPolicy', STRING, OMIT),
        (4, 'terminationGracePeriodSeconds', INT64, POINTER),
        (5, 'activeDeadlineSeconds', INT64, POINTER),
        (6, 'dnsPolicy', STRING, OMIT),
        (7, 'nodeSelector', Map(STRING), OMIT),
        (8, 'serviceAccountName', STRING, OMIT),
        (9, 'serviceAccount', STRING, OMIT),
        (21, 'automountServiceAccountToken', BOOL, POINTER),
        (10, 'nodeName', STRING, OMIT),
        (11, 'hostNetwork', BOOL, OMIT),
        (12, 'hostPID', BOOL, OMIT),
        (13, 'hostIPC', BOOL, OMIT),
        (27, 'shareProcessNamespace', BOOL, POINTER),
        (14, 'securityContext', 'core/v1.PodSecurityContext', POINTER),
        (15, 'imagePullSecrets', Repeated('core/v1.LocalObjectReference'), OMIT),
        (16, 'hostname', STRING, OMIT),
        (17, 'subdomain', STRING, OMIT),
        (18, 'affinity', 'core/v1.Affinity', POINTER),
        (19, 'schedulerName', STRING, OMIT),
        (22, 'tolerations', Repeated('core/v1.Toleration'), OMIT),
        (23, 'hostAliases', Repeated('core/v1.HostAlias'), OMIT),
        (24, 'priorityClassName', STRING, OMIT),
        (25, 'priority', INT32, POINTER),
        (26, 'dnsConfig', 'core/v1.PodDNSConfig', POINTER),
        (28, 'readinessGates', Repeated('core/v1.PodReadinessGate'), OMIT),
        (29, 'runtimeClassName', STRING, POINTER),
        (30, 'enableServiceLinks', BOOL, POINTER),
        (31, 'preemptionPolicy', STRING, POINTER),
        (32, 'overhead', Map(QUANTITY), OMIT),
        (33, 'topologySpreadConstraints', Repeated('core/v1.TopologySpreadConstraint'), OMIT),
        (35, 'setHostnameAsFQDN', BOOL, POINTER),
        (36, 'os', 'core/v1.PodOS', POINTER),
        (37, 'hostUsers', BOOL, POINTER),
        (38, 'schedulingGates', Repeated('core/v1.PodSchedulingGate'), OMIT),
        (39, 'resourceClaims', Repeated('core/v1.PodResourceClaim'), OMIT),
        (40, 'resources', 'core/v1.ResourceRequirements', POINTER),
        (41, 'hostnameOverride', STRING, POINTER),  # 1.34+
    ),
    'core/v1.PodStatus': (
        (1, 'phase', STRING, OMIT),
        (2, 'conditions', Repeated('core/v1.PodCondition'), OMIT),
        (3, 'message', STRING, OMIT),
        (4, 'reason', STRING, OMIT),
        (11, 'nominatedNodeName', STRING, OMIT),
        (5, 'hostIP', STRING, OMIT),
        (16, 'hostIPs', Repeated('core/v1.HostIP'), OMIT),
        (6, 'podIP', STRING, OMIT),
        (12, 'podIPs', Repeated('core/v1.PodIP'), OMIT),
        (7, 'startTime', TIME, POINTER),
        (10, 'initContainerStatuses', Repeated('core/v1.ContainerStatus'), OMIT),
        (8, 'containerStatuses', Repeated('core/v1.ContainerStatus'), OMIT),
        (9, 'qosClass', STRING, OMIT),
        (13, 'ephemeralContainerStatuses', Repeated('core/v1.ContainerStatus'), OMIT),
        (14, 'resize', STRING, OMIT),
        (15, 'resourceClaimStatuses', Repeated('core/v1.PodResourceClaimStatus'), OMIT),
    ),
    'core/v1.PodTemplate': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'template', 'core/v1.PodTemplateSpec', ALWAYS),
    ),
    'core/v1.PodTemplateSpec': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'core/v1.PodSpec', ALWAYS),
    ),
    'core/v1.PortStatus': (
        (1, 'port', INT32, ALWAYS),
        (2, 'protocol', STRING, ALWAYS),
        (3, 'error', STRING, POINTER),
    ),
    'core/v1.PortworxVolumeSource': (
        (1, 'volumeID', STRING, ALWAYS),
        (2, 'fsType', STRING, OMIT),
        (3, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.PreferredSchedulingTerm': (
        (1, 'weight', INT32, ALWAYS),
        (2, 'preference', 'core/v1.NodeSelectorTerm', ALWAYS),
    ),
    'core/v1.Probe': (
        (1, '', 'core/v1.ProbeHandler', INLINE),
        (2, 'initialDelaySeconds', INT32, OMIT),
        (3, 'timeoutSeconds', INT32, OMIT),
        (4, 'periodSeconds', INT32, OMIT),
        (5, 'successThreshold', INT32, OMIT),
        (6, 'failureThreshold', INT32, OMIT),
        (7, 'terminationGracePeriodSeconds', INT64, POINTER),
    ),
    'core/v1.ProbeHandler': (
        (1, 'exec', 'core/v1.ExecAction', POINTER),
        (2, 'httpGet', 'core/v1.HTTPGetAction', POINTER),
        (3, 'tcpSocket', 'core/v1.TCPSocketAction', POINTER),
        (4, 'grpc', 'core/v1.GRPCAction', POINTER),
    ),
    'core/v1.ProjectedVolumeSource': (
        (1, 'sources', Repeated('core/v1.VolumeProjection'), ALWAYS),
        (2, 'defaultMode', INT32, POINTER),
    ),
    'core/v1.QuobyteVolumeSource': (
        (1, 'registry', STRING, ALWAYS),
        (2, 'volume', STRING, ALWAYS),
        (3, 'readOnly', BOOL, OMIT),
        (4, 'user', STRING, OMIT),
        (5, 'group', STRING, OMIT),
        (6, 'tenant', STRING, OMIT),
    ),
    'core/v1.RBDVolumeSource': (
        (1, 'monitors', Repeated(STRING), ALWAYS),
        (2, 'image', STRING, ALWAYS),
        (3, 'fsType', STRING, OMIT),
        (4, 'pool', STRING, OMIT),
        (5, 'user', STRING, OMIT),
        (6, 'keyring', STRING, OMIT),
        (7, 'secretRef', 'core/v1.LocalObjectReference', POINTER),
        (8, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.ReplicationController': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'core/v1.ReplicationControllerSpec', ALWAYS),
        (3, 'status', 'core/v1.ReplicationControllerStatus', ALWAYS),
    ),
    'core/v1.ReplicationControllerCondition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (3, 'lastTransitionTime', TIME, ALWAYS),
        (4, 'reason', STRING, OMIT),
        (5, 'message', STRING, OMIT),
    ),
    'core/v1.ReplicationControllerSpec': (
        (1, 'replicas', INT32, POINTER),
        (4, 'minReadySeconds', INT32, OMIT),
        (2, 'selector', Map(STRING), OMIT),
        (3, 'template', 'core/v1.PodTemplateSpec', POINTER),
    ),
    'core/v1.ReplicationControllerStatus': (
        (1, 'replicas', INT32, ALWAYS),
        (2, 'fullyLabeledReplicas', INT32, OMIT),
        (4, 'readyReplicas', INT32, OMIT),
        (5, 'availableReplicas', INT32, OMIT),
        (3, 'observedGeneration', INT64, OMIT),
        (6, 'conditions', Repeated('core/v1.ReplicationControllerCondition'), OMIT),
    ),
    'core/v1.ResourceClaim': (
        (1, 'name', STRING, ALWAYS),
        (2, 'request', STRING, OMIT),
    ),
    'core/v1.ResourceFieldSelector': (
        (1, 'containerName', STRING, OMIT),
        (2, 'resource', STRING, ALWAYS),
        (3, 'divisor', QUANTITY, ALWAYS),
    ),
    'core/v1.ResourceHealth': (
        (1, 'resourceID', STRING, ALWAYS),
        (2, 'health', STRING, OMIT),
    ),
    'core/v1.ResourceQuota': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'core/v1.ResourceQuotaSpec', ALWAYS),
        (3, 'status', 'core/v1.ResourceQuotaStatus', ALWAYS),
    ),
    'core/v1.ResourceQuotaSpec': (
        (1, 'hard', Map(QUANTITY), OMIT),
        (2, 'scopes', Repeated(STRING), OMIT),
        (3, 'scopeSelector', 'core/v1.ScopeSelector', POINTER),
    ),
    'core/v1.ResourceQuotaStatus': (
        (1, 'hard', Map(QUANTITY), OMIT),
        (2, 'used', Map(QUANTITY), OMIT),
    ),
    'core/v1.ResourceRequirements': (
        (1, 'limits', Map(QUANTITY), OMIT),
        (2, 'requests', Map(QUANTITY), OMIT),
        (3, 'claims', Repeated('core/v1.ResourceClaim'), OMIT),
    ),
    'core/v1.ResourceStatus': (
        (1, 'name', STRING, ALWAYS),
        (2, 'resources', Repeated('core/v1.ResourceHealth'), OMIT),
    ),
    'core/v1.SELinuxOptions': (
        (1, 'user', STRING, OMIT),
        (2, 'role', STRING, OMIT),
        (3, 'type', STRING, OMIT),
        (4, 'level', STRING, OMIT),
    ),
    'core/v1.ScaleIOVolumeSource': (
        (1, 'gateway', STRING, ALWAYS),
        (2, 'system', STRING, ALWAYS),
        (3, 'secretRef', 'core/v1.LocalObjectReference', POINTER_OR_NULL),
        (4, 'sslEnabled', BOOL, OMIT),
        (5, 'protectionDomain', STRING, OMIT),
        (6, 'storagePool', STRING, OMIT),
        (7, 'storageMode', STRING, OMIT),
        (8, 'volumeName', STRING, OMIT),
        (9, 'fsType', STRING, OMIT),
        (10, 'readOnly', BOOL, OMIT),
    ),
    'core/v1.ScopeSelector': (
        (1, 'matchExpressions', Repeated('core/v1.ScopedResourceSelectorRequirement'), OMIT),
    ),
    'core/v1.ScopedResourceSelectorRequirement': (
        (1, 'scopeName', STRING, ALWAYS),
        (2, 'operator', STRING, ALWAYS),
        (3, 'values', Repeated(STRING), OMIT),
    ),
    'core/v1.SeccompProfile': (
        (1, 'type', STRING, ALWAYS),
        (2, 'localhostProfile', STRING, POINTER),
    ),
    'core/v1.Secret': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (5, 'immutable', BOOL, POINTER),
        (2, 'data', Map(BYTES), OMIT),
        (4, 'stringData', Map(STRING), OMIT),
        (3, 'type', STRING, OMIT),
    ),
    'core/v1.SecretEnvSource': (
        (1, '', 'core/v1.LocalObjectReference', INLINE),
        (2, 'optional', BOOL, POINTER),
    ),
    'core/v1.SecretKeySelector': (
        (1, '', 'core/v1.LocalObjectReference', INLINE),
        (2, 'key', STRING, ALWAYS),
        (3, 'optional', BOOL, POINTER),
    ),
    'core/v1.SecretProjection': (
        (1, '', 'core/v1.LocalObjectReference', INLINE),
        (2, 'items', Repeated('core/v1.KeyToPath'), OMIT),
        (4, 'optional', BOOL, POINTER),
    ),
    'core/v1.SecretVolumeSource': (
        (1, 'secretName', STRING, OMIT),
        (2, 'items', Repeated('core/v1.KeyToPath'), OMIT),
        (3, 'defaultMode', INT32, POINTER),
        (4, 'optional', BOOL, POINTER),
    ),
    'core/v1.SecurityContext': (
        (1, 'capabilities', 'core/v1.Capabilities', POINTER),
        (2, 'privileged', BOOL, POINTER),
        (3, 'seLinuxOptions', 'core/v1.SELinuxOptions', POINTER),
        (10, 'windowsOptions', 'core/v1.WindowsSecurityContextOptions', POINTER),
        (4, 'runAsUser', INT64, POINTER),
        (8, 'runAsGroup', INT64, POINTER),
        (5, 'runAsNonRoot', BOOL, POINTER),
        (6, 'readOnlyRootFilesystem', BOOL, POINTER),
        (7, 'allowPrivilegeEscalation', BOOL, POINTER),
        (9, 'procMount', STRING, POINTER),
        (11, 'seccompProfile', 'core/v1.SeccompProfile', POINTER),
        (12, 'appArmorProfile', 'core/v1.AppArmorProfile', POINTER),
    ),
    'core/v1.Service': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'core/v1.ServiceSpec', ALWAYS),
        (3, 'status', 'core/v1.ServiceStatus', ALWAYS),
    ),
    'core/v1.ServiceAccount': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'secrets', Repeated('core/v1.ObjectReference'), OMIT),
        (3, 'imagePullSecrets', Repeated('core/v1.LocalObjectReference'), OMIT),
        (4, 'automountServiceAccountToken', BOOL, POINTER),
    ),
    'core/v1.ServiceAccountTokenProjection': (
        (1, 'audience', STRING, OMIT),
        (2, 'expirationSeconds', INT64, POINTER),
        (3, 'path', STRING, ALWAYS),
    ),
    'core/v1.ServicePort': (
        (1, 'name', STRING, OMIT),
        (2, 'protocol', STRING, OMIT),
        (6, 'appProtocol', STRING, POINTER),
        (3, 'port', INT32, ALWAYS),
        (4, 'targetPort', INT_OR_STRING, ALWAYS),
        (5, 'nodePort', INT32, OMIT),
    ),
    'core/v1.ServiceSpec': (
        (1, 'ports', Repeated('core/v1.ServicePort'), OMIT),
        (2, 'selector', Map(STRING), OMIT),
        (3, 'clusterIP', STRING, OMIT),
        (18, 'clusterIPs', Repeated(STRING), OMIT),
        (4, 'type', STRING, OMIT),
        (5, 'externalIPs', Repeated(STRING), OMIT),
        (7, 'sessionAffinity', STRING, OMIT),
        (8, 'loadBalancerIP', STRING, OMIT),
        (9, 'loadBalancerSourceRanges', Repeated(STRING), OMIT),
        (10, 'externalName', STRING, OMIT),
        (11, 'externalTrafficPolicy', STRING, OMIT),
        (12, 'healthCheckNodePort', INT32, OMIT),
        (13, 'publishNotReadyAddresses', BOOL, OMIT),
        (14, 'sessionAffinityConfig', 'core/v1.SessionAffinityConfig', POINTER),
        (19, 'ipFamilies', Repeated(STRING), OMIT),
        (17, 'ipFamilyPolicy', STRING, POINTER),
        (20, 'allocateLoadBalancerNodePorts', BOOL, POINTER),
        (21, 'loadBalancerClass', STRING, POINTER),
        (22, 'internalTrafficPolicy', STRING, POINTER),
        (23, 'trafficDistribution', STRING, POINTER),
    ),
    'core/v1.ServiceStatus': (
        (1, 'loadBalancer', 'core/v1.LoadBalancerStatus', ALWAYS),
        (2, 'conditions', Repeated('meta/v1.Condition'), OMIT),
    ),
    'core/v1.SessionAffinityConfig': (
        (1, 'clientIP', 'core/v1.ClientIPConfig', POINTER),
    ),
    'core/v1.SleepAction': (
        (1, 'seconds', INT64, ALWAYS),
    ),
    'core/v1.StorageOSVolumeSource': (
        (1, 'volumeName', STRING, OMIT),
        (2, 'volumeNamespace', STRING, OMIT),
        (3, 'fsType', STRING, OMIT),
        (4, 'readOnly', BOOL, OMIT),
        (5, 'secretRef', 'core/v1.LocalObjectReference', POINTER),
    ),
    'core/v1.Sysctl': (
        (1, 'name', STRING, ALWAYS),
        (2, 'value', STRING, ALWAYS),
    ),
    'core/v1.TCPSocketAction': (
        (1, 'port', INT_OR_STRING, ALWAYS),
        (2, 'host', STRING, OMIT),
    ),
    'core/v1.Toleration': (
        (1, 'key', STRING, OMIT),
        (2, 'operator', STRING, OMIT),
        (3, 'value', STRING, OMIT),
        (4, 'effect', STRING, OMIT),
        (5, 'tolerationSeconds', INT64, POINTER),
    ),
    'core/v1.TopologySpreadConstraint': (
        (1, 'maxSkew', INT32, ALWAYS),
        (2, 'topologyKey', STRING, ALWAYS),
        (3, 'whenUnsatisfiable', STRING, ALWAYS),
        (4, 'labelSelector', 'meta/v1.LabelSelector', POINTER),
        (5, 'minDomains', INT32, POINTER),
        (6, 'nodeAffinityPolicy', STRING, POINTER),
        (7, 'nodeTaintsPolicy', STRING, POINTER),
        (8, 'matchLabelKeys', Repeated(STRING), OMIT),
    ),
    'core/v1.TypedLocalObjectReference': (
        (1, 'apiGroup', STRING, POINTER),
        (2, 'kind', STRING, ALWAYS),
        (3, 'name', STRING, ALWAYS),
    ),
    'core/v1.TypedObjectReference': (
        (1, 'apiGroup', STRING, POINTER),
        (2, 'kind', STRING, ALWAYS),
        (3, 'name', STRING, ALWAYS),
        (4, 'namespace', STRING, POINTER),
    ),
    'core/v1.Volume': (
        (1, 'name', STRING, ALWAYS),
        (2, '', 'core/v1.VolumeSource', INLINE),
    ),
    'core/v1.VolumeDevice': (
        (1, 'name', STRING, ALWAYS),
        (2, 'devicePath', STRING, ALWAYS),
    ),
    'core/v1.VolumeMount': (
        (1, 'name', STRING, ALWAYS),
        (2, 'readOnly', BOOL, OMIT),
        (7, 'recursiveReadOnly', STRING, POINTER),
        (3, 'mountPath', STRING, ALWAYS),
        (4, 'subPath', STRING, OMIT),
        (5, 'mountPropagation', STRING, POINTER),
        (6, 'subPathExpr', STRING, OMIT),
    ),
    'core/v1.VolumeMountStatus': (
        (1, 'name', STRING, ALWAYS),
        (2, 'mountPath', STRING, ALWAYS),
        (3, 'readOnly', BOOL, OMIT),
        (4, 'recursiveReadOnly', STRING, POINTER),
    ),
    'core/v1.VolumeProjection': (
        (1, 'secret', 'core/v1.SecretProjection', POINTER),
        (2, 'downwardAPI', 'core/v1.DownwardAPIProjection', POINTER),
        (3, 'configMap', 'core/v1.ConfigMapProjection', POINTER),
        (4, 'serviceAccountToken', 'core/v1.ServiceAccountTokenProjection', POINTER),
        (5, 'clusterTrustBundle', 'core/v1.ClusterTrustBundleProjection', POINTER),
    ),
    'core/v1.VolumeResourceRequirements': (
        (1, 'limits', Map(QUANTITY), OMIT),
        (2, 'requests', Map(QUANTITY), OMIT),
    ),
    'core/v1.VolumeSource': (
        (1, 'hostPath', 'core/v1.HostPathVolumeSource', POINTER),
        (2, 'emptyDir', 'core/v1.EmptyDirVolumeSource', POINTER),
        (3, 'gcePersistentDisk', 'core/v1.GCEPersistentDiskVolumeSource', POINTER),
        (4, 'awsElasticBlockStore', 'core/v1.AWSElasticBlockStoreVolumeSource', POINTER),
        (5, 'gitRepo', 'core/v1.GitRepoVolumeSource', POINTER),
        (6, 'secret', 'core/v1.SecretVolumeSource', POINTER),
        (7, 'nfs', 'core/v1.NFSVolumeSource', POINTER),
        (8, 'iscsi', 'core/v1.ISCSIVolumeSource', POINTER),
        (9, 'glusterfs', 'core/v1.GlusterfsVolumeSource', POINTER),
        (10, 'persistentVolumeClaim', 'core/v1.PersistentVolumeClaimVolumeSource', POINTER),
        (11, 'rbd', 'core/v1.RBDVolumeSource', POINTER),
        (12, 'flexVolume', 'core/v1.FlexVolumeSource', POINTER),
        (13, 'cinder', 'core/v1.CinderVolumeSource', POINTER),
        (14, 'cephfs', 'core/v1.CephFSVolumeSource', POINTER),
        (15, 'flocker', 'core/v1.FlockerVolumeSource', POINTER),
        (16, 'downwardAPI', 'core/v1.DownwardAPIVolumeSource', POINTER),
        (17, 'fc', 'core/v1.FCVolumeSource', POINTER),
        (18, 'azureFile', 'core/v1.AzureFileVolumeSource', POINTER),
        (19, 'configMap', 'core/v1.ConfigMapVolumeSource', POINTER),
        (20, 'vsphereVolume', 'core/v1.VsphereVirtualDiskVolumeSource', POINTER),
        (21, 'quobyte', 'core/v1.QuobyteVolumeSource', POINTER),
        (22, 'azureDisk', 'core/v1.AzureDiskVolumeSource', POINTER),
        (23, 'photonPersistentDisk', 'core/v1.PhotonPersistentDiskVolumeSource', POINTER),
        (26, 'projected', 'core/v1.ProjectedVolumeSource', POINTER),
        (24, 'portworxVolume', 'core/v1.PortworxVolumeSource', POINTER),
        (25, 'scaleIO', 'core/v1.ScaleIOVolumeSource', POINTER),
        (27, 'storageos', 'core/v1.StorageOSVolumeSource', POINTER),
        (28, 'csi', 'core/v1.CSIVolumeSource', POINTER),
        (29, 'ephemeral', 'core/v1.EphemeralVolumeSource', POINTER),
        (30, 'image', 'core/v1.ImageVolumeSource', POINTER),
    ),
    'core/v1.VsphereVirtualDiskVolumeSource': (
        (1, 'volumePath', STRING, ALWAYS),
        (2, 'fsType', STRING, OMIT),
        (3, 'storagePolicyName', STRING, OMIT),
        (4, 'storagePolicyID', STRING, OMIT),
    ),
    'core/v1.WeightedPodAffinityTerm': (
        (1, 'weight', INT32, ALWAYS),
        (2, 'podAffinityTerm', 'core/v1.PodAffinityTerm', ALWAYS),
    ),
    'core/v1.WindowsSecurityContextOptions': (
        (1, 'gmsaCredentialSpecName', STRING, POINTER),
        (2, 'gmsaCredentialSpec', STRING, POINTER),
        (3, 'runAsUserName', STRING, POINTER),
        (4, 'hostProcess', BOOL, POINTER),
    ),
    'discovery/v1.Endpoint': (
        (1, 'addresses', Repeated(STRING), ALWAYS),
        (2, 'conditions', 'discovery/v1.EndpointConditions', ALWAYS),
        (3, 'hostname', STRING, POINTER),
        (4, 'targetRef', 'core/v1.ObjectReference', POINTER),
        (5, 'deprecatedTopology', Map(STRING), OMIT),
        (6, 'nodeName', STRING, POINTER),
        (7, 'zone', STRING, POINTER),
        (8, 'hints', 'discovery/v1.EndpointHints', POINTER),
    ),
    'discovery/v1.EndpointConditions': (
        (1, 'ready', BOOL, POINTER),
        (2, 'serving', BOOL, POINTER),
        (3, 'terminating', BOOL, POINTER),
    ),
    'discovery/v1.EndpointHints': (
        (1, 'forZones', Repeated('discovery/v1.ForZone'), OMIT),
    ),
    'discovery/v1.EndpointPort': (
        (1, 'name', STRING, POINTER),
        (2, 'protocol', STRING, POINTER),
        (3, 'port', INT32, POINTER),
        (4, 'appProtocol', STRING, POINTER),
    ),
    'discovery/v1.EndpointSlice': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (4, 'addressType', STRING, ALWAYS),
        (2, 'endpoints', Repeated('discovery/v1.Endpoint'), ALWAYS),
        (3, 'ports', Repeated('discovery/v1.EndpointPort'), OMIT),
    ),
    'discovery/v1.ForZone': (
        (1, 'name', STRING, ALWAYS),
    ),
    'meta/v1.Condition': (
        (1, 'type', STRING, ALWAYS),
        (2, 'status', STRING, ALWAYS),
        (3, 'observedGeneration', INT64, OMIT),
        (4, 'lastTransitionTime', TIME, ALWAYS),
        (5, 'reason', STRING, ALWAYS),
        (6, 'message', STRING, ALWAYS),
    ),
    'meta/v1.DeleteOptions': (
        (1, 'gracePeriodSeconds', INT64, POINTER),
        (2, 'preconditions', 'meta/v1.Preconditions', POINTER),
        (3, 'orphanDependents', BOOL, POINTER),
        (4, 'propagationPolicy', STRING, POINTER),
        (5, 'dryRun', Repeated(STRING), OMIT),
        (6, 'ignoreStoreReadErrorWithClusterBreakingPotential', BOOL, POINTER),
    ),
    'meta/v1.LabelSelector': (
        (1, 'matchLabels', Map(STRING), OMIT),
        (2, 'matchExpressions', Repeated('meta/v1.LabelSelectorRequirement'), OMIT),
    ),
    'meta/v1.LabelSelectorRequirement': (
        (1, 'key', STRING, ALWAYS),
        (2, 'operator', STRING, ALWAYS),
        (3, 'values', Repeated(STRING), OMIT),
    ),
    'meta/v1.ListMeta': (
        (1, 'selfLink', STRING, OMIT),
        (2, 'resourceVersion', STRING, OMIT),
        (3, 'continue', STRING, OMIT),
        (4, 'remainingItemCount', INT64, POINTER),
    ),
    'meta/v1.ManagedFieldsEntry': (
        (1, 'manager', STRING, OMIT),
        (2, 'operation', STRING, OMIT),
        (3, 'apiVersion', STRING, OMIT),
        (4, 'time', TIME, POINTER),
        (6, 'fieldsType', STRING, OMIT),
        (7, 'fieldsV1', RAW_JSON, POINTER),
        (8, 'subresource', STRING, OMIT),
    ),
    'meta/v1.ObjectMeta': (
        (1, 'name', STRING, OMIT),
        (2, 'generateName', STRING, OMIT),
        (3, 'namespace', STRING, OMIT),
        (4, 'selfLink', STRING, OMIT),
        (5, 'uid', STRING, OMIT),
        (6, 'resourceVersion', STRING, OMIT),
        (7, 'generation', INT64, OMIT),
        # omitzero since apimachinery 1.33 (kubectl 1.32 still prints null): OMIT drops the zero.
        (8, 'creationTimestamp', TIME, OMIT),
        (9, 'deletionTimestamp', TIME, POINTER),
        (10, 'deletionGracePeriodSeconds', INT64, POINTER),
        (11, 'labels', Map(STRING), OMIT),
        (12, 'annotations', Map(STRING), OMIT),
        (13, 'ownerReferences', Repeated('meta/v1.OwnerReference'), OMIT),
        (14, 'finalizers', Repeated(STRING), OMIT),
        (17, 'managedFields', Repeated('meta/v1.ManagedFieldsEntry'), OMIT),
    ),
    'meta/v1.OwnerReference': (
        (5, 'apiVersion', STRING, ALWAYS),
        (1, 'kind', STRING, ALWAYS),
        (3, 'name', STRING, ALWAYS),
        (4, 'uid', STRING, ALWAYS),
        (6, 'controller', BOOL, POINTER),
        (7, 'blockOwnerDeletion', BOOL, POINTER),
    ),
    'meta/v1.Preconditions': (
        (1, 'uid', STRING, POINTER),
        (2, 'resourceVersion', STRING, POINTER),
    ),
    'meta/v1.Status': (
        (1, 'metadata', 'meta/v1.ListMeta', ALWAYS),
        (2, 'status', STRING, OMIT),
        (3, 'message', STRING, OMIT),
        (4, 'reason', STRING, OMIT),
        (5, 'details', 'meta/v1.StatusDetails', POINTER),
        (6, 'code', INT32, OMIT),
    ),
    'meta/v1.StatusCause': (
        (1, 'reason', STRING, OMIT),
        (2, 'message', STRING, OMIT),
        (3, 'field', STRING, OMIT),
    ),
    'meta/v1.StatusDetails': (
        (1, 'name', STRING, OMIT),
        (2, 'group', STRING, OMIT),
        (3, 'kind', STRING, OMIT),
        (6, 'uid', STRING, OMIT),
        (4, 'causes', Repeated('meta/v1.StatusCause'), OMIT),
        (5, 'retryAfterSeconds', INT32, OMIT),
    ),
    'networking/v1.HTTPIngressPath': (
        (1, 'path', STRING, OMIT),
        (3, 'pathType', STRING, POINTER_OR_NULL),
        (2, 'backend', 'networking/v1.IngressBackend', ALWAYS),
    ),
    'networking/v1.HTTPIngressRuleValue': (
        (1, 'paths', Repeated('networking/v1.HTTPIngressPath'), ALWAYS),
    ),
    'networking/v1.IPBlock': (
        (1, 'cidr', STRING, ALWAYS),
        (2, 'except', Repeated(STRING), OMIT),
    ),
    'networking/v1.Ingress': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'networking/v1.IngressSpec', ALWAYS),
        (3, 'status', 'networking/v1.IngressStatus', ALWAYS),
    ),
    'networking/v1.IngressBackend': (
        (4, 'service', 'networking/v1.IngressServiceBackend', POINTER),
        (3, 'resource', 'core/v1.TypedLocalObjectReference', POINTER),
    ),
    'networking/v1.IngressClass': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'networking/v1.IngressClassSpec', ALWAYS),
    ),
    'networking/v1.IngressClassParametersReference': (
        (1, 'apiGroup', STRING, POINTER),
        (2, 'kind', STRING, ALWAYS),
        (3, 'name', STRING, ALWAYS),
        (4, 'scope', STRING, POINTER),
        (5, 'namespace', STRING, POINTER),
    ),
    'networking/v1.IngressClassSpec': (
        (1, 'controller', STRING, OMIT),
        (2, 'parameters', 'networking/v1.IngressClassParametersReference', POINTER),
    ),
    'networking/v1.IngressLoadBalancerIngress': (
        (1, 'ip', STRING, OMIT),
        (2, 'hostname', STRING, OMIT),
        (4, 'ports', Repeated('networking/v1.IngressPortStatus'), OMIT),
    ),
    'networking/v1.IngressLoadBalancerStatus': (
        (1, 'ingress', Repeated('networking/v1.IngressLoadBalancerIngress'), OMIT),
    ),
    'networking/v1.IngressPortStatus': (
        (1, 'port', INT32, ALWAYS),
        (2, 'protocol', STRING, ALWAYS),
        (3, 'error', STRING, POINTER),
    ),
    'networking/v1.IngressRule': (
        (1, 'host', STRING, OMIT),
        (2, '', 'networking/v1.IngressRuleValue', INLINE),
    ),
    'networking/v1.IngressRuleValue': (
        (1, 'http', 'networking/v1.HTTPIngressRuleValue', POINTER),
    ),
    'networking/v1.IngressServiceBackend': (
        (1, 'name', STRING, ALWAYS),
        (2, 'port', 'networking/v1.ServiceBackendPort', ALWAYS),
    ),
    'networking/v1.IngressSpec': (
        (4, 'ingressClassName', STRING, POINTER),
        (1, 'defaultBackend', 'networking/v1.IngressBackend', POINTER),
        (2, 'tls', Repeated('networking/v1.IngressTLS'), OMIT),
        (3, 'rules', Repeated('networking/v1.IngressRule'), OMIT),
    ),
    'networking/v1.IngressStatus': (
        (1, 'loadBalancer', 'networking/v1.IngressLoadBalancerStatus', ALWAYS),
    ),
    'networking/v1.IngressTLS': (
        (1, 'hosts', Repeated(STRING), OMIT),
        (2, 'secretName', STRING, OMIT),
    ),
    'networking/v1.NetworkPolicy': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'networking/v1.NetworkPolicySpec', ALWAYS),
    ),
    'networking/v1.NetworkPolicyEgressRule': (
        (1, 'ports', Repeated('networking/v1.NetworkPolicyPort'), OMIT),
        (2, 'to', Repeated('networking/v1.NetworkPolicyPeer'), OMIT),
    ),
    'networking/v1.NetworkPolicyIngressRule': (
        (1, 'ports', Repeated('networking/v1.NetworkPolicyPort'), OMIT),
        (2, 'from', Repeated('networking/v1.NetworkPolicyPeer'), OMIT),
    ),
    'networking/v1.NetworkPolicyPeer': (
        (1, 'podSelector', 'meta/v1.LabelSelector', POINTER),
        (2, 'namespaceSelector', 'meta/v1.LabelSelector', POINTER),
        (3, 'ipBlock', 'networking/v1.IPBlock', POINTER),
    ),
    'networking/v1.NetworkPolicyPort': (
        (1, 'protocol', STRING, POINTER),
        (2, 'port', INT_OR_STRING, POINTER),
        (3, 'endPort', INT32, POINTER),
    ),
    'networking/v1.NetworkPolicySpec': (
        (1, 'podSelector', 'meta/v1.LabelSelector', ALWAYS),
        (2, 'ingress', Repeated('networking/v1.NetworkPolicyIngressRule'), OMIT),
        (3, 'egress', Repeated('networking/v1.NetworkPolicyEgressRule'), OMIT),
        (4, 'policyTypes', Repeated(STRING), OMIT),
    ),
    'networking/v1.ServiceBackendPort': (
        (1, 'name', STRING, OMIT),
        (2, 'number', INT32, OMIT),
    ),
    'policy/v1.Eviction': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'deleteOptions', 'meta/v1.DeleteOptions', POINTER),
    ),
    'policy/v1.PodDisruptionBudget': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'spec', 'policy/v1.PodDisruptionBudgetSpec', ALWAYS),
        (3, 'status', 'policy/v1.PodDisruptionBudgetStatus', ALWAYS),
    ),
    'policy/v1.PodDisruptionBudgetSpec': (
        (1, 'minAvailable', INT_OR_STRING, POINTER),
        (2, 'selector', 'meta/v1.LabelSelector', POINTER),
        (3, 'maxUnavailable', INT_OR_STRING, POINTER),
        (4, 'unhealthyPodEvictionPolicy', STRING, POINTER),
    ),
    'policy/v1.PodDisruptionBudgetStatus': (
        (1, 'observedGeneration', INT64, OMIT),
        (2, 'disruptedPods', Map(TIME), OMIT),
        (3, 'disruptionsAllowed', INT32, ALWAYS),
        (4, 'currentHealthy', INT32, ALWAYS),
        (5, 'desiredHealthy', INT32, ALWAYS),
        (6, 'expectedPods', INT32, ALWAYS),
        (7, 'conditions', Repeated('meta/v1.Condition'), OMIT),
    ),
    'rbac/v1.AggregationRule': (
        (1, 'clusterRoleSelectors', Repeated('meta/v1.LabelSelector'), OMIT),
    ),
    'rbac/v1.ClusterRole': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'rules', Repeated('rbac/v1.PolicyRule'), ALWAYS),
        (3, 'aggregationRule', 'rbac/v1.AggregationRule', POINTER),
    ),
    'rbac/v1.ClusterRoleBinding': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'subjects', Repeated('rbac/v1.Subject'), OMIT),
        (3, 'roleRef', 'rbac/v1.RoleRef', ALWAYS),
    ),
    'rbac/v1.PolicyRule': (
        (1, 'verbs', Repeated(STRING), ALWAYS),
        (2, 'apiGroups', Repeated(STRING), OMIT),
        (3, 'resources', Repeated(STRING), OMIT),
        (4, 'resourceNames', Repeated(STRING), OMIT),
        (5, 'nonResourceURLs', Repeated(STRING), OMIT),
    ),
    'rbac/v1.Role': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'rules', Repeated('rbac/v1.PolicyRule'), ALWAYS),
    ),
    'rbac/v1.RoleBinding': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'subjects', Repeated('rbac/v1.Subject'), OMIT),
        (3, 'roleRef', 'rbac/v1.RoleRef', ALWAYS),
    ),
    'rbac/v1.RoleRef': (
        (1, 'apiGroup', STRING, ALWAYS),
        (2, 'kind', STRING, ALWAYS),
        (3, 'name', STRING, ALWAYS),
    ),
    'rbac/v1.Subject': (
        (1, 'kind', STRING, ALWAYS),
        (2, 'apiGroup', STRING, OMIT),
        (3, 'name', STRING, ALWAYS),
        (4, 'namespace', STRING, OMIT),
    ),
    'scheduling/v1.PriorityClass': (
        (1, 'metadata', 'meta/v1.ObjectMeta', ALWAYS),
        (2, 'value', INT32, ALWAYS),
        (3, 'globalDefault', BOOL, OMIT),
        (4, 'description', STRING, OMIT),
        (5, 'preemptionPolicy', STRING, POINTER),
    ),
}
# fmt: on

# (apiVersion, kind) of the envelope -> top-level message.
_KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "core/v1.Namespace",
    ("v1", "Pod"): "core/v1.Pod",
    ("v1", "PodTemplate"): "core/v1.PodTemplate",
    ("v1", "Service"): "core/v1.Service",
    ("v1", "ConfigMap"): "core/v1.ConfigMap",
    ("v1", "Secret"): "core/v1.Secret",
    ("v1", "ServiceAccount"): "core/v1.ServiceAccount",
    ("v1", "PersistentVolumeClaim"): "core/v1.PersistentVolumeClaim",
    ("v1", "ReplicationController"): "core/v1.ReplicationController",
    ("v1", "ResourceQuota"): "core/v1.ResourceQuota",
    ("v1", "LimitRange"): "core/v1.LimitRange",
    ("v1", "Endpoints"): "core/v1.Endpoints",
    ("v1", "Binding"): "core/v1.Binding",
    ("v1", "DeleteOptions"): "meta/v1.DeleteOptions",
    ("meta.k8s.io/v1", "DeleteOptions"): "meta/v1.DeleteOptions",
    ("v1", "Status"): "meta/v1.Status",
    ("apps/v1", "Deployment"): "apps/v1.Deployment",
    ("apps/v1", "StatefulSet"): "apps/v1.StatefulSet",
    ("apps/v1", "DaemonSet"): "apps/v1.DaemonSet",
    ("apps/v1", "ReplicaSet"): "apps/v1.ReplicaSet",
    ("batch/v1", "Job"): "batch/v1.Job",
    ("batch/v1", "CronJob"): "batch/v1.CronJob",
    ("networking.k8s.io/v1", "Ingress"): "networking/v1.Ingress",
    ("networking.k8s.io/v1", "IngressClass"): "networking/v1.IngressClass",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networking/v1.NetworkPolicy",
    ("autoscaling/v1", "HorizontalPodAutoscaler"): "autoscaling/v1.HorizontalPodAutoscaler",
    ("autoscaling/v1", "Scale"): "autoscaling/v1.Scale",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "autoscaling/v2.HorizontalPodAutoscaler",
    ("discovery.k8s.io/v1", "EndpointSlice"): "discovery/v1.EndpointSlice",
    ("policy/v1", "PodDisruptionBudget"): "policy/v1.PodDisruptionBudget",
    ("policy/v1", "Eviction"): "policy/v1.Eviction",
    ("rbac.authorization.k8s.io/v1", "Role"): "rbac/v1.Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rbac/v1.RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "rbac/v1.ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "rbac/v1.ClusterRoleBinding",
    ("scheduling.k8s.io/v1", "PriorityClass"): "scheduling/v1.PriorityClass",
    ("authentication.k8s.io/v1", "TokenRequest"): "authentication/v1.TokenRequest",
    ("coordination.k8s.io/v1", "Lease"): "coordination/v1.Lease",
}


def _build(tables: dict[str, tuple[tuple[int, str, Kind, Presence], ...]]) -> dict[str, Message]:
    messages: dict[str, Message] = {}
    for name, rows in tables.items():
        fields = tuple(Field(number=n, json_name=j, kind=k, presence=p) for n, j, k, p in rows)
        messages[name] = Message(name=name, fields=fields, by_number={f.number: f for f in fields})
    # A dangling reference would only surface on some rare input; fail at import instead.
    for message in messages.values():
        for f in message.fields:
            inner = f.kind.item if isinstance(f.kind, Repeated) else f.kind
            inner = inner.value if isinstance(inner, Map) else inner
            if isinstance(inner, str) and inner not in messages:
                raise RuntimeError(f"{message.name}.{f.json_name}: unknown message {inner}")
    for target in _KINDS.values():
        if target not in messages:
            raise RuntimeError(f"unknown top-level message {target}")
    return messages


MESSAGES = _build(_MESSAGES)


def supported_kinds() -> frozenset[tuple[str, str]]:
    """(apiVersion, kind) pairs that ``decode_protobuf_object`` accepts."""
    return frozenset(_KINDS)


# --------------------------------------------------------------------------------------------------
# Wire format

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_MASK64 = (1 << 64) - 1


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise ProtobufDecodeError("truncated varint")
        if shift >= 64:
            raise ProtobufDecodeError("varint longer than 64 bits")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            # Go's decoders keep the low 64 bits of a 10-byte varint; so do we.
            return result & _MASK64, pos
        shift += 7


WireValue: TypeAlias = int | memoryview


def _iter_fields(buf: memoryview) -> Iterator[tuple[int, int, WireValue]]:
    """Yield (field number, wire type, value); fixed-width values come back as ints."""
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = _read_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0 or number > 0x1FFFFFFF:
            raise ProtobufDecodeError(f"illegal field number {number}")
        if wire_type == _VARINT:
            value, pos = _read_varint(buf, pos)
            yield number, wire_type, value
        elif wire_type == _LEN:
            length, pos = _read_varint(buf, pos)
            if length > end - pos:
                raise ProtobufDecodeError("length-delimited field runs past its message")
            yield number, wire_type, buf[pos : pos + length]
            pos += length
        elif wire_type in (_FIXED64, _FIXED32):
            width = 8 if wire_type == _FIXED64 else 4
            if width > end - pos:
                raise ProtobufDecodeError("truncated fixed-width field")
            yield number, wire_type, int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        else:
            # Groups (3, 4) are proto1 relics no Kubernetes type uses; 6 and 7 do not exist.
            raise ProtobufDecodeError(f"unsupported wire type {wire_type} (field {number})")


def _as_int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _as_int32(v: int) -> int:
    # gogo accumulates into an int32, so only the low 32 bits survive.
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _string(buf: memoryview) -> str:
    # Go strings need not be UTF-8; encoding/json writes invalid bytes as U+FFFD.
    return bytes(buf).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------------
# Special apimachinery messages


def _small_fields(buf: memoryview) -> dict[int, tuple[int, WireValue]]:
    """Last (wire type, value) per field number of a tiny fixed message (Time, IntOrString, …)."""
    return {number: (wire_type, value) for number, wire_type, value in _iter_fields(buf)}


def _varint_field(fields: dict[int, tuple[int, WireValue]], number: int, what: str) -> int:
    wire_type, value = fields.get(number, (_VARINT, 0))
    if wire_type != _VARINT:
        raise ProtobufDecodeError(f"{what}: field {number} must be a varint")
    assert isinstance(value, int)
    return value


def _bytes_field(
    fields: dict[int, tuple[int, WireValue]], number: int, what: str
) -> memoryview | None:
    if number not in fields:
        return None
    wire_type, value = fields[number]
    if wire_type != _LEN:
        raise ProtobufDecodeError(f"{what}: field {number} must be length-delimited")
    assert isinstance(value, memoryview)
    return value


_UNIX_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
# time.Unix(s, 0) for this s is Go's zero time.Time, which metav1.Time marshals as null.
_GO_ZERO_TIME_SECONDS = -62135596800


def _timestamp(buf: memoryview, micro: bool) -> str | None:
    what = "MicroTime" if micro else "Time"
    if len(buf) == 0:
        return None  # metav1.Time.Unmarshal: no bytes means the zero time
    fields = _small_fields(buf)
    seconds = _as_int64(_varint_field(fields, 1, what))
    # metav1.Time drops nanos on decode (time_proto.go), MicroTime keeps them.
    nanos = _as_int32(_varint_field(fields, 2, what)) if micro else 0
    total_us = seconds * 1_000_000 + nanos // 1000
    if total_us == _GO_ZERO_TIME_SECONDS * 1_000_000 and nanos % 1000 == 0:
        return None
    try:
        moment = _UNIX_EPOCH + datetime.timedelta(microseconds=total_us)
    except OverflowError:
        raise ProtobufDecodeError(f"{what} out of range: {seconds}s") from None
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ").rjust(27, "0")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ").rjust(20, "0")


def _int_or_string(buf: memoryview) -> int | str:
    fields = _small_fields(buf)
    kind = _as_int64(_varint_field(fields, 1, "IntOrString"))
    if kind == 0:
        return _as_int32(_varint_field(fields, 2, "IntOrString"))
    if kind == 1:
        raw = _bytes_field(fields, 3, "IntOrString")
        return "" if raw is None else _string(raw)
    raise ProtobufDecodeError(f"IntOrString with impossible type {kind}")


# resource.ParseQuantity's grammar: signed decimal, then a binary SI, decimal SI or exponent suffix.
_QUANTITY = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?",
    re.ASCII,
)


def _quantity(buf: memoryview) -> str:
    fields = _small_fields(buf)
    raw = _bytes_field(fields, 1, "Quantity")
    if raw is None:
        return "0"  # a zero Quantity marshals as "0"
    text = _string(raw)
    if not _QUANTITY.fullmatch(text):
        raise ProtobufDecodeError(f"quantities must match the regular expression: {text!r}")
    # kubectl always sends the canonical form (Quantity.String()), so it is passed through as is.
    return text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _raw_json(buf: memoryview) -> Any:
    fields = _small_fields(buf)
    raw = _bytes_field(fields, 1, "FieldsV1")
    if raw is None or len(raw) == 0:
        return None
    try:
        return json.loads(bytes(raw), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise ProtobufDecodeError(f"FieldsV1 is not valid JSON: {e}") from None


_SPECIAL_ZERO: dict[Scalar, Any] = {
    Scalar.TIME: None,
    Scalar.MICROTIME: None,
    Scalar.INT_OR_STRING: 0,
    Scalar.QUANTITY: "0",
    Scalar.RAW_JSON: None,
}
_SCALAR_ZERO: dict[Scalar, Any] = {
    Scalar.STRING: "",
    Scalar.BYTES: None,  # a nil []byte marshals as null
    Scalar.BOOL: False,
    Scalar.INT32: 0,
    Scalar.INT64: 0,
}


# --------------------------------------------------------------------------------------------------
# Messages


def _expect_len(value: WireValue, where: str) -> memoryview:
    if not isinstance(value, memoryview):
        raise ProtobufDecodeError(f"{where}: expected a length-delimited field")
    return value


def _scalar(kind: Scalar, wire_type: int, value: WireValue, where: str) -> Any:
    if kind in (Scalar.BOOL, Scalar.INT32, Scalar.INT64):
        if wire_type != _VARINT:
            raise ProtobufDecodeError(f"{where}: wrong wire type {wire_type} for a varint")
        assert isinstance(value, int)
        if kind is Scalar.BOOL:
            return value != 0
        return _as_int32(value) if kind is Scalar.INT32 else _as_int64(value)
    buf = _expect_len(value, where)
    if kind is Scalar.STRING:
        return _string(buf)
    if kind is Scalar.BYTES:
        return base64.b64encode(buf).decode("ascii")
    if kind is Scalar.TIME:
        return _timestamp(buf, micro=False)
    if kind is Scalar.MICROTIME:
        return _timestamp(buf, micro=True)
    if kind is Scalar.INT_OR_STRING:
        return _int_or_string(buf)
    if kind is Scalar.QUANTITY:
        return _quantity(buf)
    return _raw_json(buf)


def _zero(kind: Scalar | str) -> Any:
    """What Go's JSON encoder prints for a zero value of ``kind``."""
    if isinstance(kind, str):
        return _decode_message(MESSAGES[kind], memoryview(b""))
    if kind in _SPECIAL_ZERO:
        return _SPECIAL_ZERO[kind]
    return _SCALAR_ZERO[kind]


def _is_empty(value: Any) -> bool:
    # encoding/json's isEmptyValue for the kinds omitempty scalars can have.
    return value is None or value == "" or value is False or (type(value) is int and value == 0)


def _element(kind: Scalar | str, wire_type: int, value: WireValue, where: str) -> Any:
    if isinstance(kind, str):
        return _decode_message(MESSAGES[kind], _expect_len(value, where))
    return _scalar(kind, wire_type, value, where)


def _repeated(item: Scalar | str, seen: list[tuple[int, WireValue]], where: str) -> list[Any]:
    out: list[Any] = []
    for wire_type, value in seen:
        if item in (Scalar.BOOL, Scalar.INT32, Scalar.INT64) and wire_type == _LEN:
            # Packed encoding: gogo accepts it for repeated varints, so must we.
            assert isinstance(value, memoryview)
            pos = 0
            while pos < len(value):
                v, pos = _read_varint(value, pos)
                out.append(_scalar(item, _VARINT, v, where))
        else:
            out.append(_element(item, wire_type, value, where))
    return out


def _map(value_kind: Scalar | str, seen: list[tuple[int, WireValue]], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _, entry in seen:
        key = ""
        value: Any = _MISSING
        for number, wire_type, v in _iter_fields(_expect_len(entry, where)):
            if number == 1:
                key = _string(_expect_len(v, where))
            elif number == 2:
                value = _element(value_kind, wire_type, v, where)
        if value is _MISSING:
            # gogo leaves a missing map value at its zero value; a nil []byte value prints as "".
            value = "" if value_kind is Scalar.BYTES else _zero(value_kind)
        out[key] = value  # a repeated key: the last entry wins, as in Go
    return dict(sorted(out.items()))  # encoding/json sorts map keys


_MISSING = object()


def _decode_message(message: Message, buf: memoryview) -> dict[str, Any]:
    seen: dict[int, list[tuple[int, WireValue]]] = {}
    for number, wire_type, wire_value in _iter_fields(buf):
        if number in message.by_number:
            seen.setdefault(number, []).append((wire_type, wire_value))
        # Unknown numbers are skipped: fields added by newer clients must not break older servers.
    out: dict[str, Any] = {}
    for f in message.fields:
        where = f"{message.name}.{f.json_name or f.number}"
        values = seen.get(f.number)
        kind = f.kind
        if isinstance(kind, Repeated | Map):
            items: list[Any] | dict[str, Any] = (
                _repeated(kind.item, values or [], where)
                if isinstance(kind, Repeated)
                else _map(kind.value, values or [], where)
            )
            if items:
                out[f.json_name] = items
            elif f.presence is not Presence.OMIT:
                out[f.json_name] = None  # a nil slice or map without omitempty prints as null
            continue
        if values is None:
            if f.presence is Presence.POINTER or (
                f.presence is Presence.OMIT and not isinstance(kind, str)
            ):
                continue
            if f.presence is Presence.POINTER_OR_NULL:
                out[f.json_name] = None
                continue
            value: Any = _zero(kind)
        elif isinstance(kind, str):
            # A singular message sent several times is merged, which for the wire format is
            # exactly decoding the concatenation of the pieces.
            parts = [_expect_len(v, where) for _, v in values]
            joined = parts[0] if len(parts) == 1 else memoryview(b"".join(parts))
            value = _decode_message(MESSAGES[kind], joined)
        elif kind is Scalar.INT_OR_STRING and len(values) > 1:
            # IntOrString's Unmarshal is generated, so it merges; the other special types have
            # hand-written Unmarshal methods that replace, which "last one wins" below matches.
            parts = [_expect_len(v, where) for _, v in values]
            value = _scalar(kind, _LEN, memoryview(b"".join(parts)), where)
        else:
            last_type, last = values[-1]  # a repeated scalar: the last one wins
            value = _scalar(kind, last_type, last, where)
        if f.presence is Presence.INLINE:
            out.update(value)
        elif f.presence is Presence.OMIT and _is_empty(value):
            continue
        else:
            out[f.json_name] = value
    return out


# --------------------------------------------------------------------------------------------------
# Envelope


@attrs.frozen(kw_only=True)
class _Unknown:
    """runtime.Unknown: {typeMeta{apiVersion, kind}, raw, contentEncoding, contentType}."""

    api_version: str
    kind: str
    raw: memoryview
    content_encoding: str
    content_type: str


def _unknown(buf: memoryview) -> _Unknown:
    api_version = kind = content_encoding = content_type = ""
    raw = memoryview(b"")
    for number, _, value in _iter_fields(buf):
        if number == 1:
            for n, _, v in _iter_fields(_expect_len(value, "Unknown.typeMeta")):
                if n == 1:
                    api_version = _string(_expect_len(v, "TypeMeta.apiVersion"))
                elif n == 2:
                    kind = _string(_expect_len(v, "TypeMeta.kind"))
        elif number == 2:
            raw = _expect_len(value, "Unknown.raw")
        elif number == 3:
            content_encoding = _string(_expect_len(value, "Unknown.contentEncoding"))
        elif number == 4:
            content_type = _string(_expect_len(value, "Unknown.contentType"))
    return _Unknown(
        api_version=api_version,
        kind=kind,
        raw=raw,
        content_encoding=content_encoding,
        content_type=content_type,
    )


def decode_protobuf_object(body: bytes) -> dict[str, Any]:
    """Decode a ``application/vnd.kubernetes.protobuf`` request body into its JSON-API dict.

    The result starts with ``kind`` and ``apiVersion`` (from the envelope) followed by the object's
    fields, as ``kubectl ... -o json`` would print the same object. Raises ``ProtobufDecodeError``
    for anything malformed, and for kinds outside ``supported_kinds()``.
    """
    if not isinstance(body, bytes | bytearray | memoryview):
        raise ProtobufDecodeError("body must be bytes")
    buf = memoryview(bytes(body))
    if buf[: len(MAGIC)] != MAGIC:
        raise ProtobufDecodeError("missing the k8s\\x00 protobuf magic")
    try:
        envelope = _unknown(buf[len(MAGIC) :])
        if envelope.content_encoding:
            raise ProtobufDecodeError(f"unsupported contentEncoding {envelope.content_encoding!r}")
        if envelope.content_type not in ("", _PROTOBUF_CONTENT_TYPE):
            raise ProtobufDecodeError(f"unsupported inner contentType {envelope.content_type!r}")
        target = _KINDS.get((envelope.api_version, envelope.kind))
        if target is None:
            raise ProtobufDecodeError(
                f"no protobuf decoder for {envelope.api_version or '?'}/{envelope.kind or '?'}"
            )
        fields = _decode_message(MESSAGES[target], envelope.raw)
    except ProtobufDecodeError:
        raise
    except (ValueError, OverflowError, RecursionError) as e:  # pragma: no cover
        # Safety net: the decoder must never leak another exception type to the HTTP layer.
        raise ProtobufDecodeError(f"malformed protobuf body: {e}") from None
    return {"kind": envelope.kind, "apiVersion": envelope.api_version, **fields}
