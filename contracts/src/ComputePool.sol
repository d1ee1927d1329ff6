// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MessageHashUtils} from "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";
import {EnumerableSet} from "@openzeppelin/contracts/utils/structs/EnumerableSet.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {IntellectToken} from "./IntellectToken.sol";
import {ComputeRegistry} from "./ComputeRegistry.sol";
import {DomainRegistry} from "./DomainRegistry.sol";

/// @title ComputePool
/// @notice Pools of compute nodes inside a domain: membership by the manager's signed invite,
/// work submissions, invalidation (slash + eject) by validators, and time-locked rewards.
/// Work is kept in an append-only array per pool; invalidation flips a status, never moves an
/// entry, so reading "work since t" with an index cursor is stable (no swap-and-pop).
/// Many files can be recorded in one transaction (`submitWorkBatch`): the batch keeps a Merkle root
/// over its (work key, units) leaves and each file keeps one storage slot (its batch, units and
/// status), so a key is never counted twice and every file is voted on, slashed and pardoned alone.
contract ComputePool is AccessControl {
    using EnumerableSet for EnumerableSet.AddressSet;

    bytes32 public constant VALIDATOR_ROLE = keccak256("VALIDATOR_ROLE");

    enum PoolStatus {
        PENDING,
        ACTIVE,
        COMPLETED
    }

    enum WorkStatus {
        NONE,
        SUBMITTED,
        INVALIDATED,
        SOFT_INVALIDATED
    }

    struct Pool {
        uint256 id;
        uint256 domainId;
        address creator;
        address manager;
        string name;
        string dataURI;
        uint256 computeLimit; // 0 = unlimited
        uint256 totalComputeUnits;
        PoolStatus status;
        uint64 createdAt;
        uint64 startedAt;
        uint64 endedAt;
    }

    /// @dev Packed into 3 storage slots: submitWork is the hot path.
    struct Work {
        bytes32 workKey;
        address provider;
        uint64 timestamp;
        WorkStatus status;
        address node;
        uint64 units;
        uint32 lockIndex; // index into the node's reward locks
    }

    /// @notice What views return: a Work plus the reward it still carries (0 once dropped).
    struct WorkInfo {
        bytes32 workKey;
        address provider;
        address node;
        uint256 units;
        uint256 reward;
        uint256 timestamp;
        WorkStatus status;
    }

    struct Lock {
        uint192 amount;
        uint64 unlockAt;
    }

    /// @dev Three slots for a whole batch; each file adds one slot in `_workIndex` (see `_leafSlot`).
    struct Batch {
        bytes32 root;
        address provider;
        uint40 timestamp;
        uint16 count;
        address node;
        uint64 liveUnits; // units still carrying reward (soft invalidation takes a file's units out)
        uint32 lockIndex;
    }

    /// @dev One submitted file, single or in a batch, as the voting and invalidation paths see it.
    struct Entry {
        bytes32 workKey;
        address provider;
        address node;
        uint64 timestamp;
        WorkStatus status;
        uint256 units;
        uint32 lockIndex;
        bool inBatch;
        uint256 index; // into _work (single) or _batches (batch)
    }

    /// @notice Largest batch `submitWorkBatch` takes (the event and the tree stay well inside a block).
    uint256 public constant MAX_BATCH = 256;
    /// @notice Most unmatured reward locks a node may hold. A slash drops every one of them (~5,800 gas
    /// a lock), so without a cap a node could grow its locks until its own slash no longer fits a block
    /// and its rewards matured unjudged; 2,048 locks drop for ~12M gas. A node at the cap submits again
    /// as its oldest locks mature, or batches its files (one lock a batch).
    uint256 public constant MAX_LIVE_LOCKS = 2048;
    // _workIndex value of a file in a batch: this flag | status << 128 | units << 64 | batch index.
    uint256 private constant IN_BATCH = 1 << 255;

    IntellectToken public immutable token;
    ComputeRegistry public immutable registry;
    DomainRegistry public immutable domains;

    /// @dev The three figures every submission reads, in one slot (one cold read, not three).
    struct Params {
        uint128 rewardPerUnit;
        uint64 rewardLockPeriod;
        uint64 invalidationWindow;
    }

    Params private _params;
    uint256 public slashPenalty = 200 ether;
    bool public whitelistRequired;

    uint256 public poolCount;
    mapping(uint256 => Pool) private _pools;
    mapping(uint256 => EnumerableSet.AddressSet) private _poolNodes;
    mapping(uint256 => mapping(address => bool)) public nodeBlacklisted;
    mapping(uint256 => mapping(address => bool)) public providerBlacklisted;
    mapping(bytes32 => bool) public inviteUsed;

    mapping(uint256 => Work[]) private _work;
    mapping(uint256 => mapping(bytes32 => uint256)) private _workIndex; // index + 1, or a batch file's slot
    mapping(uint256 => Batch[]) private _batches;

    mapping(address => Lock[]) private _locks;
    mapping(address => uint256) private _lockHead; // locks before this index have matured
    mapping(address => uint256) private _matured;
    mapping(address => address) public rewardRecipient; // node => provider at submission

    /// @dev quorum 0 = no policy: one vote of a global validator, the default penalty and window.
    struct SlashingPolicy {
        uint32 quorum;
        uint64 window;
        uint256 amount;
    }

    mapping(uint256 => SlashingPolicy) public slashingPolicies;
    mapping(uint256 => EnumerableSet.AddressSet) private _poolValidators;
    // One slot per voted work: hard votes (bits 0-7), soft votes (8-15), and from bit 16 one bit per
    // validator seat that voted (seat 0: a global validator of a pool without a policy, which decides
    // alone). Seats are given once per pool and never reused, so a removed validator's bit stays its own.
    mapping(uint256 => mapping(bytes32 => uint256)) private _tally;
    mapping(uint256 => mapping(address => uint256)) private _seat;
    mapping(uint256 => mapping(bytes32 => bool)) private _hardwareDecided; // keccak256(node, evidence)
    mapping(uint256 => uint256) private _seats;
    uint256 private constant MAX_SEATS = 239;
    mapping(uint256 => mapping(bytes32 => uint256)) private _softDropped;

    event PoolCreated(uint256 indexed poolId, uint256 indexed domainId, address indexed creator, address manager, string name);
    event PoolStarted(uint256 indexed poolId, uint256 timestamp);
    event PoolEnded(uint256 indexed poolId, uint256 timestamp);
    event NodeJoined(uint256 indexed poolId, address indexed provider, address indexed node, uint256 nonce);
    event NodeLeft(uint256 indexed poolId, address indexed provider, address indexed node);
    event NodeEjected(uint256 indexed poolId, address indexed provider, address indexed node, address by);
    event NodeBlacklisted(uint256 indexed poolId, address indexed node);
    event PoolProviderBlacklisted(uint256 indexed poolId, address indexed provider);
    event WorkSubmitted(
        uint256 indexed poolId, address indexed provider, address indexed node, bytes32 workKey, uint256 units, uint256 timestamp
    );
    event WorkBatchSubmitted(
        uint256 indexed poolId,
        address indexed provider,
        address indexed node,
        uint256 batchIndex,
        bytes32 root,
        bytes32[] workKeys,
        uint64[] units,
        uint256 timestamp
    );
    event WorkInvalidated(
        uint256 indexed poolId,
        address indexed provider,
        address indexed node,
        bytes32 workKey,
        uint256 slashed,
        uint256 rewardsDropped
    );
    event WorkSoftInvalidated(
        uint256 indexed poolId, address indexed provider, address indexed node, bytes32 workKey, uint256 rewardDropped
    );
    event SlashingPolicySet(uint256 indexed poolId, uint32 quorum, uint256 amount, uint64 window);
    event PoolValidatorSet(uint256 indexed poolId, address indexed validator, bool added);
    event InvalidationVoted(
        uint256 indexed poolId, bytes32 indexed workKey, address indexed validator, bool soft, uint256 votes
    );
    event WorkPardoned(uint256 indexed poolId, address indexed node, bytes32 workKey);
    event HardwareSlashVoted(uint256 indexed poolId, address indexed node, bytes32 evidence, address validator, uint256 votes);
    event NodeSlashedForHardware(
        uint256 indexed poolId, address indexed provider, address indexed node, bytes32 evidence, uint256 slashed, uint256 dropped
    );
    event RewardsClaimed(address indexed node, address indexed provider, uint256 amount);
    event ParametersUpdated(uint256 rewardPerUnit, uint256 rewardLockPeriod, uint256 invalidationWindow, uint256 slashPenalty);
    event WhitelistRequiredUpdated(bool required);

    error ZeroAddress();
    error EmptyPoolName();
    error DomainNotFound(uint256 domainId);
    error PoolNotFound(uint256 poolId);
    error NotPoolCreator(uint256 poolId, address caller);
    error NotPoolManager(uint256 poolId, address caller);
    error PoolNotPending(uint256 poolId);
    error PoolNotActive(uint256 poolId);
    error PoolAlreadyEnded(uint256 poolId);
    error NotNodeOperator(address node, address caller);
    error ProviderIsBlacklisted(address provider);
    error ProviderNotWhitelisted(address provider);
    error ProviderBlacklistedInPool(uint256 poolId, address provider);
    error NodeBlacklistedInPool(uint256 poolId, address node);
    error NodeAlreadyInPool(address node, uint256 poolId);
    error NodeNotInPool(uint256 poolId, address node);
    error InviteExpired(uint256 expiration, uint256 nowTimestamp);
    error InviteAlreadyUsed(bytes32 digest);
    error InvalidInviteSignature(address signer, address manager);
    error PoolComputeLimitExceeded(uint256 poolId, uint256 limit, uint256 requested);
    error ZeroWorkUnits();
    error BatchSize(uint256 keys, uint256 units, uint256 max);
    error BatchRootMismatch(bytes32 computed, bytes32 given);
    error WorkAlreadySubmitted(uint256 poolId, bytes32 workKey);
    error WorkKeyInvalidated(uint256 poolId, bytes32 workKey);
    error WorkNotFound(uint256 poolId, bytes32 workKey);
    error WorkAlreadyInvalidated(uint256 poolId, bytes32 workKey);
    error InvalidationWindowPassed(uint256 poolId, bytes32 workKey, uint256 deadline);
    error NothingToClaim(address node);
    error NotPoolValidator(uint256 poolId, address caller);
    error AlreadyVoted(uint256 poolId, bytes32 workKey, address validator);
    error VoteWindowClosed(uint256 poolId, bytes32 workKey, uint256 deadline);
    error InvalidQuorum(uint256 quorum, uint256 validators);
    error TooManyValidators(uint256 poolId, uint256 max);
    error InvalidWindow();
    error NotSoftInvalidated(uint256 poolId, bytes32 workKey);
    error LockShorterThanWindow(uint256 lockPeriod, uint256 window);
    error TooManyLiveLocks(address node, uint256 max);

    constructor(address admin, IntellectToken token_, ComputeRegistry registry_, DomainRegistry domains_, uint256 rewardPerUnit_) {
        if (admin == address(0) || address(token_) == address(0) || address(registry_) == address(0)) revert ZeroAddress();
        if (address(domains_) == address(0)) revert ZeroAddress();
        token = token_;
        registry = registry_;
        domains = domains_;
        _params = Params(SafeCast.toUint128(rewardPerUnit_), 24 hours, 1 days);
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
    }

    // ---- pool lifecycle (permissionless creation; the creator owns the pool) ----

    function createPool(uint256 domainId, address manager, string calldata name, string calldata dataURI, uint256 computeLimit)
        external
        returns (uint256 poolId)
    {
        if (!domains.domainExists(domainId)) revert DomainNotFound(domainId);
        if (manager == address(0)) revert ZeroAddress();
        if (bytes(name).length == 0) revert EmptyPoolName();
        poolId = ++poolCount;
        Pool storage p = _pools[poolId];
        p.id = poolId;
        p.domainId = domainId;
        p.creator = msg.sender;
        p.manager = manager;
        p.name = name;
        p.dataURI = dataURI;
        p.computeLimit = computeLimit;
        p.createdAt = uint64(block.timestamp);
        emit PoolCreated(poolId, domainId, msg.sender, manager, name);
    }

    function startPool(uint256 poolId) external {
        Pool storage p = _creatorPool(poolId);
        if (p.status != PoolStatus.PENDING) revert PoolNotPending(poolId);
        p.status = PoolStatus.ACTIVE;
        p.startedAt = uint64(block.timestamp);
        emit PoolStarted(poolId, block.timestamp);
    }

    /// @notice End the pool: no joins or work after this; nodes are released.
    function endPool(uint256 poolId) external {
        Pool storage p = _creatorPool(poolId);
        if (p.status == PoolStatus.COMPLETED) revert PoolAlreadyEnded(poolId);
        p.status = PoolStatus.COMPLETED;
        p.endedAt = uint64(block.timestamp);
        EnumerableSet.AddressSet storage set = _poolNodes[poolId];
        for (uint256 i = set.length(); i > 0; i--) {
            address node = set.at(i - 1);
            _removeFromPool(p, node);
            emit NodeLeft(poolId, _providerOf(node), node);
        }
        emit PoolEnded(poolId, block.timestamp);
    }

    // ---- membership ----

    /// @notice The digest a pool manager signs (EIP-191) to invite `node`.
    function inviteDigest(uint256 domainId, uint256 poolId, address node, uint256 nonce, uint256 expiration)
        public
        pure
        returns (bytes32)
    {
        return keccak256(abi.encodePacked(domainId, poolId, node, nonce, expiration));
    }

    function joinComputePool(uint256 poolId, address node, uint256 nonce, uint256 expiration, bytes calldata signature)
        external
    {
        Pool storage p = _pool(poolId);
        if (p.status != PoolStatus.ACTIVE) revert PoolNotActive(poolId);
        ComputeRegistry.Node memory n = registry.getNode(node);
        if (msg.sender != n.provider && msg.sender != node) revert NotNodeOperator(node, msg.sender);
        ComputeRegistry.Provider memory prov = registry.getProvider(n.provider);
        if (prov.blacklisted) revert ProviderIsBlacklisted(n.provider);
        if (whitelistRequired && !prov.whitelisted) revert ProviderNotWhitelisted(n.provider);
        if (providerBlacklisted[poolId][n.provider]) revert ProviderBlacklistedInPool(poolId, n.provider);
        if (nodeBlacklisted[poolId][node]) revert NodeBlacklistedInPool(poolId, node);
        if (n.activePool != 0) revert NodeAlreadyInPool(node, n.activePool);
        if (expiration < block.timestamp) revert InviteExpired(expiration, block.timestamp);
        bytes32 digest = inviteDigest(p.domainId, poolId, node, nonce, expiration);
        if (inviteUsed[digest]) revert InviteAlreadyUsed(digest);
        (address signer,,) = ECDSA.tryRecover(MessageHashUtils.toEthSignedMessageHash(digest), signature);
        if (signer != p.manager) revert InvalidInviteSignature(signer, p.manager);
        uint256 units = p.totalComputeUnits + n.computeUnits;
        if (p.computeLimit != 0 && units > p.computeLimit) revert PoolComputeLimitExceeded(poolId, p.computeLimit, units);
        inviteUsed[digest] = true;
        p.totalComputeUnits = units;
        _poolNodes[poolId].add(node);
        registry.setNodePool(node, poolId);
        emit NodeJoined(poolId, n.provider, node, nonce);
    }

    function leaveComputePool(uint256 poolId, address node) external {
        Pool storage p = _pool(poolId);
        address provider = _providerOf(node);
        if (msg.sender != provider && msg.sender != node) revert NotNodeOperator(node, msg.sender);
        if (!_poolNodes[poolId].contains(node)) revert NodeNotInPool(poolId, node);
        _removeFromPool(p, node);
        emit NodeLeft(poolId, provider, node);
    }

    function ejectNode(uint256 poolId, address node) external {
        Pool storage p = _managerPool(poolId);
        if (!_poolNodes[poolId].contains(node)) revert NodeNotInPool(poolId, node);
        _eject(p, node);
    }

    /// @notice Ban a node from the pool (ejecting it if present); it can never rejoin this pool.
    function blacklistNode(uint256 poolId, address node) external {
        Pool storage p = _managerPool(poolId);
        if (node == address(0)) revert ZeroAddress();
        nodeBlacklisted[poolId][node] = true;
        if (_poolNodes[poolId].contains(node)) _eject(p, node);
        emit NodeBlacklisted(poolId, node);
    }

    /// @notice Ban a provider from the pool and eject all of its nodes in it.
    function blacklistProvider(uint256 poolId, address provider) external {
        Pool storage p = _managerPool(poolId);
        if (provider == address(0)) revert ZeroAddress();
        providerBlacklisted[poolId][provider] = true;
        EnumerableSet.AddressSet storage set = _poolNodes[poolId];
        for (uint256 i = set.length(); i > 0; i--) {
            address node = set.at(i - 1);
            if (_providerOf(node) == provider) _eject(p, node);
        }
        emit PoolProviderBlacklisted(poolId, provider);
    }

    // ---- work ----

    function submitWork(uint256 poolId, address node, bytes32 workKey, uint256 units) external {
        address provider = _submitter(poolId, node);
        if (units == 0) revert ZeroWorkUnits();
        _unseen(poolId, workKey);
        uint32 lockIndex = _lockReward(poolId, node, units);
        _work[poolId].push(
            Work(workKey, provider, uint64(block.timestamp), WorkStatus.SUBMITTED, node, SafeCast.toUint64(units), lockIndex)
        );
        _workIndex[poolId][workKey] = _work[poolId].length;
        if (rewardRecipient[node] != provider) rewardRecipient[node] = provider;
        emit WorkSubmitted(poolId, provider, node, workKey, units, block.timestamp);
    }

    /// @notice Record many files in one transaction. `root` is the root of the OpenZeppelin standard
    /// Merkle tree (leaves unsorted, in the order given) over `(bytes32 workKey, uint256 units)`; the
    /// contract rebuilds it and refuses a batch whose root differs, so the uploader and the chain agree
    /// on exactly what was claimed. Every key is new to the pool (single or batch): never counted twice.
    function submitWorkBatch(
        uint256 poolId,
        address node,
        bytes32 root,
        bytes32[] calldata workKeys,
        uint64[] calldata units
    ) external {
        address provider = _submitter(poolId, node);
        uint256 n = workKeys.length;
        if (n == 0 || n != units.length || n > MAX_BATCH) revert BatchSize(n, units.length, MAX_BATCH);
        uint256 batchIndex = _batches[poolId].length;
        (bytes32 computed, uint256 total) = _recordBatch(poolId, workKeys, units, batchIndex);
        if (computed != root) revert BatchRootMismatch(computed, root);
        uint32 lockIndex = _lockReward(poolId, node, total);
        _batches[poolId].push(
            Batch(root, provider, uint40(block.timestamp), uint16(n), node, SafeCast.toUint64(total), lockIndex)
        );
        if (rewardRecipient[node] != provider) rewardRecipient[node] = provider;
        emit WorkBatchSubmitted(poolId, provider, node, batchIndex, root, workKeys, units, block.timestamp);
    }

    /// @notice Reject work: slash the provider by the penalty (capped at what it has), blacklist the node in the pool, drop the
    /// node's still-locked rewards, and eject the node from the pool. The global validator role's
    /// emergency path; pools with a slashing policy decide by `voteInvalidate` quorum.
    function invalidateWork(uint256 poolId, bytes32 workKey) external onlyRole(VALIDATOR_ROLE) {
        Pool storage p = _pool(poolId);
        Entry memory e = _submittedWork(poolId, workKey);
        uint256 deadline = uint256(e.timestamp) + _params.invalidationWindow;
        if (block.timestamp > deadline) revert InvalidationWindowPassed(poolId, workKey, deadline);
        _invalidate(p, e, slashPenalty);
    }

    // ---- slashing by quorum ----

    /// @notice Set a pool's slashing policy: `quorum` of its named validators must vote, the k-th
    /// vote slashes `amount` (to the treasury, capped at the provider's stake), within `window`
    /// seconds of the submission. Pool creator or manager only.
    function setSlashingPolicy(uint256 poolId, uint32 quorum, uint256 amount, uint64 window) external {
        _managerPool(poolId);
        if (quorum == 0 || quorum > _poolValidators[poolId].length()) {
            revert InvalidQuorum(quorum, _poolValidators[poolId].length());
        }
        if (window == 0) revert InvalidWindow();
        uint256 lockPeriod = _params.rewardLockPeriod;
        if (window > lockPeriod) revert LockShorterThanWindow(lockPeriod, window);
        slashingPolicies[poolId] = SlashingPolicy(quorum, window, amount);
        emit SlashingPolicySet(poolId, quorum, amount, window);
    }

    function addPoolValidator(uint256 poolId, address validator) external {
        _managerPool(poolId);
        if (validator == address(0)) revert ZeroAddress();
        if (_seat[poolId][validator] == 0) {
            uint256 seat = ++_seats[poolId];
            if (seat > MAX_SEATS) revert TooManyValidators(poolId, MAX_SEATS);
            _seat[poolId][validator] = seat;
        }
        if (_poolValidators[poolId].add(validator)) emit PoolValidatorSet(poolId, validator, true);
    }

    /// @notice A quorum larger than the remaining validators would make slashing impossible: refused.
    function removePoolValidator(uint256 poolId, address validator) external {
        _managerPool(poolId);
        uint256 left = _poolValidators[poolId].length() - (_poolValidators[poolId].contains(validator) ? 1 : 0);
        if (slashingPolicies[poolId].quorum > left) revert InvalidQuorum(slashingPolicies[poolId].quorum, left);
        if (_poolValidators[poolId].remove(validator)) emit PoolValidatorSet(poolId, validator, false);
    }

    function getPoolValidators(uint256 poolId) external view returns (address[] memory) {
        return _poolValidators[poolId].values();
    }

    /// @notice One validator's vote to invalidate. The quorum-th vote slashes, ejects the node and
    /// drops its locked rewards in this transaction; votes on work already decided are no-ops.
    /// A pool without a policy takes one vote of a global validator (quorum 1, the default penalty).
    /// A file inside a batch is voted on by its own key, like a single one.
    function voteInvalidate(uint256 poolId, bytes32 workKey) external {
        Pool storage p = _pool(poolId);
        (Entry memory e, SlashingPolicy memory policy) = _votable(poolId, workKey);
        if (e.status != WorkStatus.SUBMITTED) return;
        (uint256 votes, uint256 softVotes) = _cast(poolId, workKey, false);
        emit InvalidationVoted(poolId, workKey, msg.sender, false, votes);
        if (votes >= policy.quorum) _invalidate(p, e, policy.amount);
        // the quorum agrees the work is bad but not that it was cheating: no slash, no pay
        else if (votes + softVotes >= policy.quorum) _softInvalidate(poolId, e);
    }

    /// @notice Invalidate without a slash (e.g. a file storage lost, a checkpoint nobody can fetch):
    /// by the pool's quorum too, soft and hard votes together, so that one validator that could not
    /// judge (cut from storage, behind the trainer) cannot take an honest node's pay on its own.
    function voteSoftInvalidate(uint256 poolId, bytes32 workKey) external {
        _pool(poolId);
        (Entry memory e, SlashingPolicy memory policy) = _votable(poolId, workKey);
        if (e.status != WorkStatus.SUBMITTED) return;
        (uint256 hardVotes, uint256 softVotes) = _cast(poolId, workKey, true);
        uint256 votes = hardVotes + softVotes;
        emit InvalidationVoted(poolId, workKey, msg.sender, true, votes);
        if (votes >= policy.quorum) _softInvalidate(poolId, e);
    }

    /// @notice The pool's owner reverses a soft invalidation still inside the reward lock: the work
    /// counts again and its reward is locked again.
    function pardon(uint256 poolId, bytes32 workKey) external {
        _managerPool(poolId);
        Entry memory e = _entry(poolId, workKey);
        if (e.status != WorkStatus.SOFT_INVALIDATED) revert NotSoftInvalidated(poolId, workKey);
        Lock storage l = _locks[e.node][e.lockIndex];
        if (l.unlockAt <= block.timestamp) revert NotSoftInvalidated(poolId, workKey);
        _setStatus(poolId, e, WorkStatus.SUBMITTED);
        uint256 restored = _softDropped[poolId][workKey];
        l.amount = SafeCast.toUint192(l.amount + restored);
        if (e.inBatch && restored > 0) {
            Batch storage b = _batches[poolId][e.index];
            b.liveUnits += uint64(e.units);
        }
        delete _softDropped[poolId][workKey];
        emit WorkPardoned(poolId, e.node, workKey);
    }

    /// @notice One validator's vote that `node` signed a wrong answer to a hardware challenge: `evidence`
    /// is the sha256 of that evidence (the challenge, the node's signed commitment and answer, the
    /// challenger's secret: docs/hardware.md), which each validator re-checks off chain before voting.
    /// The pool's quorum decides, as for work; the deciding vote slashes the policy's amount, drops the
    /// node's locked rewards, ejects and blacklists it. Votes are tallied under
    /// keccak256(node, evidence) (`workVotes` reads them); the node must be in the pool at the first
    /// vote, and leaving afterwards does not escape the verdict.
    function voteSlashHardware(uint256 poolId, address node, bytes32 evidence) external {
        Pool storage p = _pool(poolId);
        SlashingPolicy memory policy = _policyFor(poolId);
        bytes32 key = keccak256(abi.encodePacked(node, evidence));
        if (_hardwareDecided[poolId][key]) return;
        if (_tally[poolId][key] == 0 && !_poolNodes[poolId].contains(node)) revert NodeNotInPool(poolId, node);
        (uint256 votes,) = _cast(poolId, key, false);
        emit HardwareSlashVoted(poolId, node, evidence, msg.sender, votes);
        if (votes < policy.quorum) return;
        _hardwareDecided[poolId][key] = true;
        address provider = _providerOf(node);
        uint256 slashed = registry.slashUpTo(provider, policy.amount);
        uint256 dropped = _dropLockedRewards(node);
        if (_poolNodes[poolId].contains(node)) _eject(p, node, provider);
        _blacklist(poolId, node);
        emit NodeSlashedForHardware(poolId, provider, node, evidence, slashed, dropped);
    }

    function workVotes(uint256 poolId, bytes32 workKey, address validator) external view returns (uint256 votes, bool voted) {
        uint256 t = _tally[poolId][workKey];
        return (t & 0xff, t & (1 << (16 + _seat[poolId][validator])) != 0);
    }

    /// @dev Record the sender's vote in the work's one tally slot; the counts after it.
    function _cast(uint256 poolId, bytes32 workKey, bool soft) private returns (uint256 hardVotes, uint256 softVotes) {
        uint256 t = _tally[poolId][workKey];
        uint256 bit = 1 << (16 + _seat[poolId][msg.sender]);
        if (t & bit != 0) revert AlreadyVoted(poolId, workKey, msg.sender);
        t = (t | bit) + (soft ? 1 << 8 : 1);
        _tally[poolId][workKey] = t;
        return (t & 0xff, (t >> 8) & 0xff);
    }

    /// @notice How long after a submission validators may still invalidate it in this pool.
    function _voteWindow(uint256 poolId) private view returns (uint256) {
        uint64 window = slashingPolicies[poolId].window;
        return window == 0 ? _params.invalidationWindow : window;
    }

    function _votable(uint256 poolId, bytes32 workKey) private view returns (Entry memory e, SlashingPolicy memory policy) {
        e = _entry(poolId, workKey);
        policy = _policyFor(poolId);
        uint256 deadline = uint256(e.timestamp) + policy.window;
        if (e.status == WorkStatus.SUBMITTED && block.timestamp > deadline) {
            revert VoteWindowClosed(poolId, workKey, deadline);
        }
    }

    /// @dev The pool's policy once the sender is one of its voters: a named validator of a pool with a
    /// policy, else a global validator deciding alone with the default penalty and window.
    function _policyFor(uint256 poolId) private view returns (SlashingPolicy memory policy) {
        policy = slashingPolicies[poolId];
        if (policy.quorum == 0) {
            if (!hasRole(VALIDATOR_ROLE, msg.sender)) revert NotPoolValidator(poolId, msg.sender);
            policy = SlashingPolicy(1, _params.invalidationWindow, slashPenalty);
        } else if (!_poolValidators[poolId].contains(msg.sender)) {
            revert NotPoolValidator(poolId, msg.sender);
        }
    }

    function _blacklist(uint256 poolId, address node) private {
        if (!nodeBlacklisted[poolId][node]) {
            nodeBlacklisted[poolId][node] = true;
            emit NodeBlacklisted(poolId, node);
        }
    }

    function _invalidate(Pool storage p, Entry memory e, uint256 penalty) private {
        _setStatus(p.id, e, WorkStatus.INVALIDATED);
        uint256 slashed = registry.slashUpTo(e.provider, penalty);
        uint256 dropped = _dropLockedRewards(e.node);
        if (_poolNodes[p.id].contains(e.node)) _eject(p, e.node, e.provider); // a node in a pool keeps its provider
        // A node caught cheating never rejoins this pool (an orchestrator would otherwise re-invite
        // it as soon as it shows up in discovery again).
        _blacklist(p.id, e.node);
        emit WorkInvalidated(p.id, e.provider, e.node, e.workKey, slashed, dropped);
    }

    /// @notice Reject work without penalty: the entry is marked and its still-locked reward dropped.
    function softInvalidateWork(uint256 poolId, bytes32 workKey) external onlyRole(VALIDATOR_ROLE) {
        _pool(poolId);
        Entry memory e = _submittedWork(poolId, workKey);
        uint256 deadline = uint256(e.timestamp) + _params.invalidationWindow;
        if (block.timestamp > deadline) revert InvalidationWindowPassed(poolId, workKey, deadline);
        _softInvalidate(poolId, e);
    }

    /// @dev A single file's lock is its own; a batch file takes its share of the batch's lock (the lock
    /// holds liveUnits x the rate at submission, so the share is exact).
    function _softInvalidate(uint256 poolId, Entry memory e) private {
        _setStatus(poolId, e, WorkStatus.SOFT_INVALIDATED);
        Lock storage l = _locks[e.node][e.lockIndex];
        uint256 dropped;
        if (l.unlockAt > block.timestamp) {
            if (e.inBatch) {
                Batch storage b = _batches[poolId][e.index];
                dropped = b.liveUnits == 0 ? 0 : (uint256(l.amount) * e.units) / b.liveUnits;
                b.liveUnits -= uint64(e.units);
            } else {
                dropped = l.amount;
            }
            l.amount -= uint192(dropped);
            _softDropped[poolId][e.workKey] = dropped;
        }
        emit WorkSoftInvalidated(poolId, e.provider, e.node, e.workKey, dropped);
    }

    // ---- rewards ----

    /// @notice Pay the node's matured rewards to its provider; callable by the provider or the node.
    function claimRewards(address node) external returns (uint256 amount) {
        address provider = rewardRecipient[node];
        if (msg.sender != provider && msg.sender != node) revert NotNodeOperator(node, msg.sender);
        _mature(node);
        amount = _matured[node];
        if (amount == 0) revert NothingToClaim(node);
        _matured[node] = 0;
        token.mint(provider, amount);
        emit RewardsClaimed(node, provider, amount);
    }

    function pendingRewards(address node) external view returns (uint256 total) {
        Lock[] storage list = _locks[node];
        for (uint256 i = _lockHead[node]; i < list.length; i++) {
            if (list[i].unlockAt > block.timestamp) total += list[i].amount;
        }
    }

    function claimableRewards(address node) external view returns (uint256 total) {
        total = _matured[node];
        Lock[] storage list = _locks[node];
        for (uint256 i = _lockHead[node]; i < list.length && list[i].unlockAt <= block.timestamp; i++) {
            total += list[i].amount;
        }
    }

    // ---- admin ----

    function setParameters(uint256 rewardPerUnit_, uint256 lockPeriod, uint256 window, uint256 penalty)
        external
        onlyRole(DEFAULT_ADMIN_ROLE)
    {
        if (lockPeriod < window) revert LockShorterThanWindow(lockPeriod, window);
        _params = Params(SafeCast.toUint128(rewardPerUnit_), SafeCast.toUint64(lockPeriod), SafeCast.toUint64(window));
        slashPenalty = penalty;
        emit ParametersUpdated(rewardPerUnit_, lockPeriod, window, penalty);
    }

    function rewardPerUnit() external view returns (uint256) {
        return _params.rewardPerUnit;
    }

    function rewardLockPeriod() external view returns (uint256) {
        return _params.rewardLockPeriod;
    }

    function invalidationWindow() external view returns (uint256) {
        return _params.invalidationWindow;
    }

    function setWhitelistRequired(bool required) external onlyRole(DEFAULT_ADMIN_ROLE) {
        whitelistRequired = required;
        emit WhitelistRequiredUpdated(required);
    }

    // ---- views ----

    function getPool(uint256 poolId) external view returns (Pool memory) {
        return _pool(poolId);
    }

    function getPoolNodes(uint256 poolId) external view returns (address[] memory) {
        _pool(poolId);
        return _poolNodes[poolId].values();
    }

    function isNodeInPool(uint256 poolId, address node) external view returns (bool) {
        return _poolNodes[poolId].contains(node);
    }

    /// @notice One file, single or in a batch. A batch file's reward is its share of the batch's lock.
    function getWork(uint256 poolId, bytes32 workKey) external view returns (WorkInfo memory) {
        Entry memory e = _entry(poolId, workKey);
        uint256 reward;
        if (!e.inBatch) {
            reward = _locks[e.node][e.lockIndex].amount;
        } else if (e.status == WorkStatus.SUBMITTED) {
            uint256 live = _batches[poolId][e.index].liveUnits;
            reward = live == 0 ? 0 : (uint256(_locks[e.node][e.lockIndex].amount) * e.units) / live;
        }
        return WorkInfo(workKey, e.provider, e.node, e.units, reward, e.timestamp, e.status);
    }

    function batchCount(uint256 poolId) external view returns (uint256) {
        return _batches[poolId].length;
    }

    function getBatch(uint256 poolId, uint256 batchIndex) external view returns (Batch memory) {
        return _batches[poolId][batchIndex];
    }

    /// @notice Whether (workKey, units) is a leaf of the batch's tree: anyone holding a file and its
    /// proof can show what a batch claimed for it without reading logs.
    function verifyBatchLeaf(uint256 poolId, uint256 batchIndex, bytes32 workKey, uint256 units, bytes32[] calldata proof)
        external
        view
        returns (bool)
    {
        bytes32 leaf = keccak256(bytes.concat(keccak256(abi.encode(workKey, units))));
        return MerkleProof.verifyCalldata(proof, _batches[poolId][batchIndex].root, leaf);
    }

    function workCount(uint256 poolId) external view returns (uint256) {
        return _work[poolId].length;
    }

    /// @notice First index whose timestamp is >= `since` (timestamps are non-decreasing by index).
    function workIndexSince(uint256 poolId, uint256 since) public view returns (uint256 lo) {
        Work[] storage list = _work[poolId];
        uint256 hi = list.length;
        while (lo < hi) {
            uint256 mid = (lo + hi) / 2;
            if (list[mid].timestamp < since) lo = mid + 1;
            else hi = mid;
        }
    }

    /// @notice Page through work submitted at or after `since`, in submission order.
    /// Scans at most `limit` entries from max(cursor, first index since); returns the entries
    /// still SUBMITTED and the cursor to pass next (== workCount when done).
    function getWorkSince(uint256 poolId, uint256 since, uint256 cursor, uint256 limit)
        external
        view
        returns (WorkInfo[] memory items, uint256 next)
    {
        Work[] storage list = _work[poolId];
        uint256 start = workIndexSince(poolId, since);
        if (cursor > start) start = cursor;
        uint256 end = start + limit;
        if (end > list.length) end = list.length;
        if (start > end) start = end;
        uint256 count;
        for (uint256 i = start; i < end; i++) {
            if (list[i].status == WorkStatus.SUBMITTED) count++;
        }
        items = new WorkInfo[](count);
        uint256 j;
        for (uint256 i = start; i < end; i++) {
            if (list[i].status == WorkStatus.SUBMITTED) items[j++] = _info(list[i]);
        }
        next = end;
    }

    // ---- internal ----

    function _info(Work storage w) private view returns (WorkInfo memory) {
        uint256 reward = _locks[w.node][w.lockIndex].amount;
        return WorkInfo(w.workKey, w.provider, w.node, w.units, reward, w.timestamp, w.status);
    }

    function _pool(uint256 poolId) private view returns (Pool storage p) {
        p = _pools[poolId];
        if (p.id == 0) revert PoolNotFound(poolId);
    }

    function _creatorPool(uint256 poolId) private view returns (Pool storage p) {
        p = _pool(poolId);
        if (msg.sender != p.creator) revert NotPoolCreator(poolId, msg.sender);
    }

    function _managerPool(uint256 poolId) private view returns (Pool storage p) {
        p = _pool(poolId);
        if (msg.sender != p.manager && msg.sender != p.creator) revert NotPoolManager(poolId, msg.sender);
    }

    /// @dev One pass over the files: each key takes its slot for good (its units and status beside the
    /// batch index) and places its leaf of OpenZeppelin's StandardMerkleTree (npm merkle-tree) over
    /// (bytes32, uint256) with `sortLeaves: false` (leaf i at tree[2n - 2 - i]); then node i - 1 hashes
    /// its children tree[2i - 1] and tree[2i] commutatively, down to the root at tree[0]. A batch whose
    /// root differs reverts in the caller, taking every slot written here with it.
    function _recordBatch(uint256 poolId, bytes32[] calldata workKeys, uint64[] calldata units, uint256 batchIndex)
        private
        returns (bytes32 root, uint256 total)
    {
        mapping(bytes32 => uint256) storage index = _workIndex[poolId];
        uint256 tag = IN_BATCH | (uint256(WorkStatus.SUBMITTED) << 128) | batchIndex;
        uint256 n = workKeys.length;
        bytes32[] memory tree = new bytes32[](2 * n - 1);
        // unchecked: n <= MAX_BATCH, and a sum of 256 uint64 values fits a uint256
        unchecked {
            for (uint256 i = 0; i < n; ++i) {
                bytes32 key = workKeys[i];
                uint64 u = units[i];
                if (u == 0) revert ZeroWorkUnits();
                if (index[key] != 0) _unseen(poolId, key);
                index[key] = tag | (uint256(u) << 64);
                total += u;
                assembly ("memory-safe") {
                    // leaf = keccak256(bytes.concat(keccak256(abi.encode(key, u)))), stored at tree[2n - 2 - i]
                    mstore(0x00, key)
                    mstore(0x20, u)
                    mstore(0x00, keccak256(0x00, 0x40))
                    mstore(add(tree, shl(5, sub(sub(shl(1, n), 1), i))), keccak256(0x00, 0x20))
                }
            }
            for (uint256 i = n - 1; i > 0; --i) {
                assembly ("memory-safe") {
                    let a := mload(add(tree, shl(6, i))) // tree[2i - 1]
                    let b := mload(add(tree, add(shl(6, i), 0x20))) // tree[2i]
                    if gt(a, b) {
                        let t := a
                        a := b
                        b := t
                    }
                    mstore(0x00, a)
                    mstore(0x20, b)
                    mstore(add(tree, shl(5, i)), keccak256(0x00, 0x40)) // tree[i - 1]
                }
            }
        }
        assembly ("memory-safe") {
            root := mload(add(tree, 0x20))
        }
    }

    function _submittedWork(uint256 poolId, bytes32 workKey) private view returns (Entry memory e) {
        e = _entry(poolId, workKey);
        if (e.status != WorkStatus.SUBMITTED) revert WorkAlreadyInvalidated(poolId, workKey);
    }

    function _entry(uint256 poolId, bytes32 workKey) private view returns (Entry memory e) {
        uint256 v = _workIndex[poolId][workKey];
        if (v == 0) revert WorkNotFound(poolId, workKey);
        if (v & IN_BATCH == 0) {
            Work storage w = _work[poolId][v - 1];
            return Entry(workKey, w.provider, w.node, w.timestamp, w.status, w.units, w.lockIndex, false, v - 1);
        }
        uint256 index = uint64(v);
        Batch storage b = _batches[poolId][index];
        e = Entry(workKey, b.provider, b.node, b.timestamp, WorkStatus(uint8(v >> 128)), uint64(v >> 64), b.lockIndex, true, index);
    }

    function _setStatus(uint256 poolId, Entry memory e, WorkStatus status) private {
        if (!e.inBatch) {
            _work[poolId][e.index].status = status;
        } else {
            _workIndex[poolId][e.workKey] = IN_BATCH | (uint256(status) << 128) | (e.units << 64) | e.index;
        }
        e.status = status;
    }

    /// @dev Who may submit for `node` (its provider or itself) into an active pool it belongs to.
    function _submitter(uint256 poolId, address node) private view returns (address provider) {
        Pool storage p = _pool(poolId);
        if (p.status != PoolStatus.ACTIVE) revert PoolNotActive(poolId);
        provider = _providerOf(node);
        if (msg.sender != provider && msg.sender != node) revert NotNodeOperator(node, msg.sender);
        if (!_poolNodes[poolId].contains(node)) revert NodeNotInPool(poolId, node);
    }

    /// @dev Reads the status from the slot alone: a key repeated inside the batch being recorded points
    /// at a batch not pushed yet.
    function _unseen(uint256 poolId, bytes32 workKey) private view {
        uint256 v = _workIndex[poolId][workKey];
        if (v == 0) return;
        WorkStatus status = v & IN_BATCH == 0 ? _work[poolId][v - 1].status : WorkStatus(uint8(v >> 128));
        if (status == WorkStatus.SUBMITTED) revert WorkAlreadySubmitted(poolId, workKey);
        revert WorkKeyInvalidated(poolId, workKey);
    }

    /// @dev No reward unlocks while validators may still invalidate the work: the later of the lock
    /// period and the pool's voting window (the setters keep lock >= window; this holds it per work
    /// even if a setting changes later).
    function _lockReward(uint256 poolId, address node, uint256 units) private returns (uint32 lockIndex) {
        Lock[] storage locks = _locks[node];
        lockIndex = SafeCast.toUint32(locks.length);
        if (locks.length - _lockHead[node] >= MAX_LIVE_LOCKS) {
            _mature(node); // moves the head past what has matured since
            if (locks.length - _lockHead[node] >= MAX_LIVE_LOCKS) revert TooManyLiveLocks(node, MAX_LIVE_LOCKS);
        }
        Params memory params = _params;
        uint256 lock = params.rewardLockPeriod;
        uint256 window = slashingPolicies[poolId].window;
        if (window == 0) window = params.invalidationWindow;
        if (window > lock) lock = window;
        locks.push(Lock(SafeCast.toUint192(units * params.rewardPerUnit), uint64(block.timestamp + lock)));
    }

    function _providerOf(address node) private view returns (address) {
        return registry.providerOf(node);
    }

    function _removeFromPool(Pool storage p, address node) private {
        _poolNodes[p.id].remove(node);
        p.totalComputeUnits -= registry.clearNodePool(node);
    }

    function _eject(Pool storage p, address node) private {
        _eject(p, node, _providerOf(node));
    }

    function _eject(Pool storage p, address node, address provider) private {
        _removeFromPool(p, node);
        emit NodeEjected(p.id, provider, node, msg.sender);
    }

    /// @dev Move locks whose time has come into the claimable balance.
    function _mature(address node) private {
        Lock[] storage list = _locks[node];
        uint256 head = _lockHead[node];
        uint256 i = head;
        uint256 sum;
        while (i < list.length && list[i].unlockAt <= block.timestamp) {
            sum += list[i].amount;
            i++;
        }
        if (i == head) return; // nothing matured: no writes
        _lockHead[node] = i;
        _matured[node] += sum;
    }

    function _dropLockedRewards(address node) private returns (uint256 dropped) {
        _mature(node);
        Lock[] storage list = _locks[node];
        for (uint256 i = _lockHead[node]; i < list.length; i++) {
            dropped += list[i].amount;
            list[i].amount = 0;
        }
    }
}
