"""Archive and replay: park sidelined backlogs in S3, bring them back with a Glue PySpark job.

Sidelined traffic past its budget is moved to S3 by the archiver (started by the controller), so a
backlog never becomes insurmountable; the replay job (``glue_jobs/replay_backlog.py``) re-enqueues
it fairly and at a rate the live system can take. Compose it in the stack::

    ArchiveAndReplay(self, "Archive", config=config, functions=self.functions, key=self.key,
                     live_queues=[p.queue for p in self.queues.live],
                     sideline_queues=[p.queue for p in self.queues.sideline],
                     state_table=self.tables.state)
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Aws, CfnElement, Duration, Fn, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_glue as glue
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sqs as sqs
from constructs import Construct, IConstruct

from breakwater_cdk import environment
from breakwater_cdk.assets import GLUE_JOBS, stage_replay_library
from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.functions import RETENTION, BreakwaterFunction, FunctionFactory
from breakwater_cdk.nag import acknowledge

ARCHIVE_PREFIX = "archive/"
REPLAY_PREFIX = "replay/"
_WORKER_TYPES = {"G.1X": glue.WorkerType.G_1X, "G.2X": glue.WorkerType.G_2X}
# Action wildcards of CDK's grantRead/grantReadWrite/grantEncryptDecrypt (acknowledged, prefix-scoped).
_GRANT_WILDCARDS = (
    "s3:GetObject*", "s3:GetBucket*", "s3:List*", "s3:DeleteObject*", "s3:Abort*",
    "kms:GenerateDataKey*", "kms:ReEncrypt*",
)  # fmt: skip


def _logical_id(construct: IConstruct) -> str:
    """The logical id of an L2's resource, as cdk-nag names it in a finding (``<Id.Arn>``)."""
    resource = construct.node.default_child
    assert isinstance(resource, CfnElement)
    stack = Stack.of(construct)
    return str(stack.resolve(stack.get_logical_id(resource)))


class ArchiveAndReplay(Construct):
    """``.bucket``, ``.archiver`` (a BreakwaterFunction), ``.job`` (the replay PySparkEtlJob)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        functions: FunctionFactory,
        key: kms.IKey,
        live_queues: Sequence[sqs.IQueue],
        sideline_queues: Sequence[sqs.IQueue],
        state_table: dynamodb.ITable,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._key = key
        self.access_logs = self._build_access_log_bucket()
        self.bucket = self._build_archive_bucket()
        self._bucket_id = _logical_id(self.bucket)
        self.archiver = self._build_archiver(functions, sideline_queues, state_table)
        self._archiver_id = _logical_id(self.archiver.function)
        self.job = self._build_replay_job(live_queues)
        self._build_triggers()

    # -- the archive ------------------------------------------------------------------------------

    def _build_access_log_bucket(self) -> s3.Bucket:
        # Server access logs can only be delivered to an SSE-S3 bucket.
        bucket = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[
                s3.LifecycleRule(expiration=Duration.days(self._config.archive.access_log_days))
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            bucket, "AwsSolutions-S1", "this is the access-log bucket of the archive; it does not log itself"
        )
        return bucket

    def _build_archive_bucket(self) -> s3.Bucket:
        archive = self._config.archive
        transitions = []
        if archive.infrequent_access_after_days is not None:
            transitions.append(
                s3.Transition(
                    storage_class=s3.StorageClass.INFREQUENT_ACCESS,
                    transition_after=Duration.days(archive.infrequent_access_after_days),
                )
            )
        return s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self._key,
            bucket_key_enabled=True,  # one KMS call per object batch, not per object
            enforce_ssl=True,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="archive-bucket/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireArchive",
                    expiration=Duration.days(archive.expire_after_days),
                    transitions=transitions,
                    noncurrent_version_expiration=Duration.days(archive.noncurrent_versions_days),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )

    def _build_archiver(
        self, functions: FunctionFactory, sideline_queues: Sequence[sqs.IQueue], state_table: dynamodb.ITable
    ) -> BreakwaterFunction:
        archive = self._config.archive
        archiver = functions.build(
            "Archiver",
            handler="archiver/handler.handler",
            description="Moves a sideline queue past its budget into the S3 archive",
            environment=environment.archiver_environment(
                self._config,
                bucket=self.bucket,
                prefix=ARCHIVE_PREFIX,
                state=state_table,
                sideline_queues=sideline_queues,
            ),
            memory_mb=archive.archiver_memory_mb,
            timeout_seconds=archive.archiver_timeout_seconds,
        )
        self.bucket.grant_put(archiver.role, f"{ARCHIVE_PREFIX}*")
        for queue in sideline_queues:
            queue.grant_consume_messages(archiver.role)
        # What it archived leaves the tenants' backlog estimates: ADD to their counters items only.
        archiver.role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:UpdateItem"],
                resources=[state_table.table_arn],
                conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["tenant#*"]}},
            )
        )
        policy = archiver.role.node.find_child("DefaultPolicy")
        for finding in (
            "Action::s3:Abort*",
            "Action::kms:GenerateDataKey*",
            "Action::kms:ReEncrypt*",
            f"Resource::<{self._bucket_id}.Arn>/archive/*",
        ):
            acknowledge(
                policy,
                f"AwsSolutions-IAM5[{finding}]",
                "CDK's grantPut on the archive bucket, limited to the archive/ prefix: new objects whose "
                "keys are not known in advance, and the stack key's data keys for their encryption",
            )
        return archiver

    # -- the replay job ---------------------------------------------------------------------------

    def _build_replay_job(self, live_queues: Sequence[sqs.IQueue]) -> glue.PySparkEtlJob:
        archive = self._config.archive
        role = iam.Role(
            self,
            "ReplayRole",
            assumed_by=iam.ServicePrincipal("glue.amazonaws.com"),
            description=f"{self._config.service_name} replay job: read the archive, send to the live queues",
        )
        security = glue.SecurityConfiguration(
            self,
            "ReplaySecurity",
            cloud_watch_encryption=glue.CloudWatchEncryption.kms(self._key),
            job_bookmarks_encryption=glue.JobBookmarksEncryption.client_side_kms(self._key),
            s3_encryption=glue.S3Encryption.kms(self._key),
        )
        log_group = logs.LogGroup(
            self,
            "ReplayLogs",
            retention=RETENTION[self._config.functions.log_retention_days],
            encryption_key=self._key,
            removal_policy=RemovalPolicy.DESTROY,
        )
        library = s3_assets.Asset(self, "ReplayLibrary", path=str(stage_replay_library()))
        job = glue.PySparkEtlJob(
            self,
            "ReplayJob",
            description="Replays parked backlogs from the S3 archive into the live queues, fairly and paced",
            role=role,
            glue_version=glue.GlueVersion.V5_0,
            script=glue.Code.from_asset(str(GLUE_JOBS / "replay_backlog.py")),
            extra_python_files=[glue.Code.from_bucket(library.bucket, library.s3_object_key)],
            worker_configuration=glue.WorkerConfiguration(
                worker_type=_WORKER_TYPES[archive.replay_worker_type],
                number_of_workers=archive.replay_workers,
            ),
            security_configuration=security,
            continuous_logging=glue.ContinuousLoggingProps(enabled=True, log_group=log_group, quiet=True),
            timeout=Duration.minutes(archive.replay_timeout_minutes),
            max_concurrent_runs=1,  # two replays of one archive would send everything twice
            max_retries=0,  # a retry re-sends what the first attempt sent; rerun on purpose instead
            default_arguments=self._job_arguments(live_queues),
        )
        self._grant_replay(role, live_queues, log_group)
        return job

    def _job_arguments(self, live_queues: Sequence[sqs.IQueue]) -> dict[str, str]:
        """Every argument the entry point resolves, with a default; a run overrides what it needs."""
        archive_root = f"s3://{self.bucket.bucket_name}/{ARCHIVE_PREFIX}"
        return {
            "--job-bookmark-option": "job-bookmark-enable",
            "--archive_path": archive_root,
            "--output_path": f"s3://{self.bucket.bucket_name}/{REPLAY_PREFIX}",
            "--queue_urls": Fn.join(",", [queue.queue_url for queue in live_queues]),
            "--shard_size": str(min(self._config.queue_set.shard_size, len(live_queues))),
            "--fair_queues": "true" if self._config.queue_set.fair_queues else "false",
            "--target_rate": str(self._config.archive.replay_target_rate),
            "--run_id": "",
            "--window_start": "",
            "--window_end": "",
            "--tenants": "",
            "--cutoff": "",
            "--dry_run": "false",
            "--partitions": "",
            "--endpoint_url": "",
        }

    def _grant_replay(
        self, role: iam.Role, live_queues: Sequence[sqs.IQueue], log_group: logs.LogGroup
    ) -> None:
        self.bucket.grant_read(role, f"{ARCHIVE_PREFIX}*")
        self.bucket.grant_read_write(role, f"{REPLAY_PREFIX}*")  # rejects, failures, report
        for queue in live_queues:
            queue.grant_send_messages(role)
            queue.grant(role, "sqs:GetQueueAttributes")  # queue depth for choose_queue, as ingest
        self._key.grant_encrypt_decrypt(role)  # security configuration: logs, bookmarks, job output
        log_group.grant_write(role)
        glue_logs = f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:/aws-glue/*"
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="GlueDriverLogs",
                actions=[
                    "logs:CreateLogGroup",
                    "logs:CreateLogStream",
                    "logs:PutLogEvents",
                    "logs:AssociateKmsKey",
                ],
                resources=[glue_logs],
            )
        )
        policy = role.node.find_child("DefaultPolicy")
        findings = [
            *(f"Action::{action}" for action in _GRANT_WILDCARDS),
            f"Resource::<{self._bucket_id}.Arn>/archive/*",
            f"Resource::<{self._bucket_id}.Arn>/replay/*",
            "Resource::arn:<AWS::Partition>:s3:::cdk-hnb659fds-assets-<AWS::AccountId>-<AWS::Region>/*",
            "Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:/aws-glue/*",
        ]
        for finding in findings:
            acknowledge(
                policy,
                f"AwsSolutions-IAM5[{finding}]",
                "CDK's bucket and key grants, limited to the archive bucket's archive/ (read) and replay/ "
                "(job output) prefixes; the job's script and library assets (read); Glue's own /aws-glue/* "
                "log groups, whose names Glue derives from the security configuration",
            )

    def _build_triggers(self) -> None:
        glue.CfnTrigger(
            self,
            "ReplayOnDemand",
            type="ON_DEMAND",
            description="start the replay by hand: aws glue start-trigger (or start-job-run with arguments)",
            actions=[glue.CfnTrigger.ActionProperty(job_name=self.job.job_name)],
        )
        schedule = self._config.archive.replay_schedule
        if schedule is not None:
            glue.CfnTrigger(
                self,
                "ReplaySchedule",
                type="SCHEDULED",
                schedule=schedule,
                start_on_creation=True,
                description="scheduled replay of the archive",
                actions=[glue.CfnTrigger.ActionProperty(job_name=self.job.job_name)],
            )

    # -- for the controller -----------------------------------------------------------------------

    def grant_start(self, grantee: iam.IGrantable) -> None:
        """Let ``grantee`` (the controller) start the archiver; the replay is an operator's decision.

        Only the archiver: when to bring a parked backlog back (and at what rate, for which tenants)
        is for an operator (``bin/replay``) or the optional schedule, so no function may start the job.
        """
        self.archiver.function.grant_invoke(grantee)  # the function and its versions (<arn>:*)
        if isinstance(grantee, iam.Role):
            acknowledge(
                grantee.node.find_child("DefaultPolicy"),
                f"AwsSolutions-IAM5[Resource::<{self._archiver_id}.Arn>:*]",
                "CDK's grantInvoke: the archiver function and its versions, nothing else",
            )

    def controller_environment(self) -> dict[str, str]:
        """What the controller needs to start the archiver (merge into its environment)."""
        return {"ARCHIVER_FUNCTION_NAME": self.archiver.function.function_name}
