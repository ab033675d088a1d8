"""The loader's one network edge: asking the cloud metadata servers at start, within one bounded budget.

What to ask and what the answers mean is `config/cloud_metadata.py`'s (pure); the
decision they feed is `config/platform.py`'s. Here the requests are sent, each
with its own timeout, all of it within `DETECT_TIMEOUT` (5 s, upstream's
detection timeout): a metadata server that accepts and never answers, or an
address that swallows packets, delays the agent's start by that much at most,
and the agent goes on as upstream does when its detection times out (no
platform). Nothing is asked with `CLOUD_PLATFORM=none`; with `GCP_METADATA` set
the platform is GCP without a question (its values come from the variable, as
upstream), and only the zone may be asked, as a last resort for the locality.

Detection asks GCE (`http://169.254.169.254/`, unless `GCE_METADATA_HOST` says
it is GCE) and AWS (its token, then `iam/info`) at once and reads the DMI vendor
for Azure; the first to say yes is the platform, whose values are then asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from istio_agent.config import cloud_metadata as cloud
from istio_agent.config import env
from istio_agent.config.cloud_metadata import CloudFacts, Request
from istio_agent.config.platform import AWS, AZURE, CLOUD_PLATFORMS, GCP, NONE, gcp_static_metadata

log = logging.getLogger(__name__)

Answer = tuple[int, dict[str, str], str]  # status, headers (names lower-cased), body
Ask = Callable[[Request], Awaitable[Answer | None]]


async def _ask(request: Request) -> Answer | None:
    """(status, headers, body) of one request, None when it failed or took longer than its timeout."""
    from istio_agent.httpio.client import fetch_once  # before the clock starts: AWS's requests have 100 ms

    try:
        async with asyncio.timeout(request.timeout):
            answer = await fetch_once(request.url, request.headers, request.method, limit=256 * 1024)
    except (OSError, ConnectionError, ValueError, TimeoutError) as exc:
        log.debug("metadata server: %s %s: %s", request.method, request.url, exc or type(exc).__name__)
        return None
    return answer.status, answer.headers, answer.body.decode(errors="replace")


class CloudProbe:
    """Asks one environment's questions; `facts()` is the whole of it, bounded by `budget` seconds."""

    def __init__(self, environment: env.Environment, *, ipv6: bool = False, sys_vendor: str | None = None,
                 zone_wanted: bool = False, budget: float = cloud.DETECT_TIMEOUT, ask: Ask = _ask) -> None:
        self.environment = environment
        self.ask = ask  # one request's answer, None when it failed (tests give their own servers)
        self.ipv6 = ipv6
        self.sys_vendor = sys_vendor
        self.zone_wanted = zone_wanted  # the locality would otherwise have no zone: GCE's is asked last
        self.budget = budget
        self.host = environment.get(env.GCE_METADATA_HOST)
        self._detected = ""  # what detection found, once it has

    def wanted(self) -> bool:
        """Whether anything is to be asked at all."""
        return self.environment.get(env.CLOUD_PLATFORM).lower() != NONE

    async def facts(self) -> CloudFacts:
        try:
            async with asyncio.timeout(self.budget):
                return await self._facts()
        except TimeoutError:
            log.info("timed out waiting for platform detection (%gs), treating it as Unknown", self.budget)
            return CloudFacts(detected=self._detected, timed_out=True)

    async def _facts(self) -> CloudFacts:
        chosen = self.environment.get(env.CLOUD_PLATFORM).lower()
        static = gcp_static_metadata(self.environment.get(env.GCP_METADATA),
                                     self.environment.get(env.GCP_QUOTA_PROJECT), self.environment.get(env.GCP_ZONE))
        if chosen == NONE:
            return CloudFacts()
        if chosen == GCP or (chosen not in CLOUD_PLATFORMS and static):
            return await self._gcp(fill=not static)
        if chosen == AWS:
            return await self._aws(await self._aws_token())
        if chosen == AZURE:
            return await self._azure()
        return await self._detect()

    async def _detect(self) -> CloudFacts:
        if cloud.azure_detected(self.sys_vendor):
            self._detected = AZURE
            return await self._azure()
        gce = asyncio.ensure_future(self._is_gce())
        aws = asyncio.ensure_future(self._is_aws())
        try:
            for first in asyncio.as_completed((gce, aws)):
                result = await first
                if result is True:
                    self._detected = GCP
                    return await self._gcp(fill=True)
                if isinstance(result, str):
                    self._detected = AWS
                    return await self._aws(result)
        finally:
            for task in (gce, aws):
                task.cancel()
        return CloudFacts()

    async def _is_gce(self) -> bool:
        if self.host:
            return True  # GCE_METADATA_HOST: the metadata client takes it as being on GCE
        answer = await self.ask(cloud.gcp_detect_request())
        return answer is not None and cloud.gcp_detected(answer[1])

    async def _is_aws(self) -> str | None:
        """The IMDS token ("" for IMDSv1) when this is AWS, else None."""
        token = await self._aws_token()
        info = await self.ask(cloud.aws_request(self.ipv6, "iam/info", token))
        return token if info is not None and cloud.aws_detected(cloud.aws_answer(info[0], info[2])) else None

    async def _aws_token(self) -> str:
        answer = await self.ask(cloud.aws_token_request(self.ipv6))
        return (cloud.aws_answer(answer[0], answer[2]) or "") if answer is not None else ""

    async def _gcp(self, fill: bool) -> CloudFacts:
        paths = [(key, path, trimmed) for key, path, trimmed in cloud.GCP_VALUES] if fill else []
        ask_zone = fill or self.zone_wanted
        zone_request = [self.ask(cloud.gcp_request(self.host, cloud.GCP_ZONE_PATH))] if ask_zone else []
        answers = await asyncio.gather(*(self.ask(cloud.gcp_request(self.host, path)) for _, path, _ in paths),
                                       *zone_request)
        values = {key: cloud.gcp_value(a[0], a[2], trimmed) if a is not None else None
                  for (key, _, trimmed), a in zip(paths, answers, strict=False)}
        zone_answer = answers[-1] if ask_zone else None
        zone = cloud.gcp_zone(cloud.gcp_value(zone_answer[0], zone_answer[2], True) if zone_answer else None)
        metadata = cloud.gcp_metadata(values, zone) if fill else {}
        return CloudFacts(detected=self._detected, gcp=metadata, gcp_zone=zone)

    async def _aws(self, token: str) -> CloudFacts:
        answers = await asyncio.gather(*(self.ask(cloud.aws_request(self.ipv6, path, token))
                                         for _, path in cloud.AWS_VALUES))
        values = {key: cloud.aws_answer(a[0], a[2]) if a is not None else None
                  for (key, _), a in zip(cloud.AWS_VALUES, answers, strict=True)}
        return CloudFacts(detected=self._detected, aws=cloud.aws_metadata(values))

    async def _azure(self) -> CloudFacts:
        versions = await self.ask(cloud.azure_request(""))
        version = cloud.azure_api_version(versions[2] if versions is not None else None)
        instance = await self.ask(cloud.azure_request(f"api-version={version}"))
        metadata, locality = cloud.azure_metadata(instance[2] if instance is not None else None)
        return CloudFacts(detected=self._detected, azure=metadata, azure_locality=locality)


def probe_cloud(environment: env.Environment, *, ipv6: bool = False, sys_vendor: str | None = None,
                zone_wanted: bool = False, budget: float = cloud.DETECT_TIMEOUT) -> CloudFacts:
    """What the metadata servers tell this environment, asked now (the loader runs before the agent's loop)."""
    probe = CloudProbe(environment, ipv6=ipv6, sys_vendor=sys_vendor, zone_wanted=zone_wanted, budget=budget)
    if not probe.wanted():
        return CloudFacts()
    return asyncio.run(probe.facts())
