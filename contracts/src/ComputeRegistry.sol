// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MessageHashUtils} from "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";
import {EnumerableSet} from "@openzeppelin/contracts/utils/structs/EnumerableSet.sol";

/// @title ComputeRegistry
/// @notice Providers stake tokens and register compute nodes. The stake must always cover
/// (total compute units + 1) x stakeMinimum, so adding a node of `u` units needs
/// (total + u + 1) x stakeMinimum. Stake leaves only through a 7-day unbonding, and slashing
/// reaches unbonding stake first, so a provider cannot dodge a slash by unbonding.
contract ComputeRegistry is AccessControl {
    using SafeERC20 for IERC20;
    using EnumerableSet for EnumerableSet.AddressSet;

    bytes32 public constant FEDERATOR_ROLE = keccak256("FEDERATOR_ROLE");
    bytes32 public constant VALIDATOR_ROLE = keccak256("VALIDATOR_ROLE");
    /// @dev Held by ComputePool: records pool membership of nodes and slashes.
    bytes32 public constant POOL_ROLE = keccak256("POOL_ROLE");

    struct Provider {
        bool registered;
        bool whitelisted;
        bool blacklisted;
        uint256 stake;
        uint256 totalComputeUnits;
        uint256 nodeCount;
        uint64 registeredAt;
    }

    struct Node {
        address provider;
        uint256 computeUnits;
        bool validated;
        uint256 activePool; // 0 = in no pool
        uint64 addedAt;
    }

    struct Unbond {
        uint256 amount;
        uint64 releaseAt;
    }

    IERC20 public immutable token;
    uint256 public stakeMinimum;
    uint256 public unbondingPeriod = 7 days;
    address public treasury;

    mapping(address => Provider) private _providers;
    mapping(address => Node) private _nodes;
    mapping(address => EnumerableSet.AddressSet) private _providerNodes;
    mapping(address => Unbond[]) private _unbonds;

    event ProviderRegistered(address indexed provider, uint256 stake);
    event ProviderDeregistered(address indexed provider, uint256 unbondingAmount);
    event StakeIncreased(address indexed provider, uint256 amount, uint256 newStake);
    event UnbondingStarted(address indexed provider, uint256 amount, uint256 releaseAt);
    event UnbondedClaimed(address indexed provider, uint256 amount);
    event ProviderSlashed(address indexed provider, uint256 amount, address indexed by);
    event ProviderWhitelisted(address indexed provider, bool status);
    event ProviderBlacklisted(address indexed provider, bool status);
    event NodeAdded(address indexed provider, address indexed node, uint256 computeUnits);
    event NodeRemoved(address indexed provider, address indexed node);
    event NodeValidated(address indexed node, bool status);
    event NodePoolChanged(address indexed node, uint256 poolId);
    event StakeMinimumUpdated(uint256 stakeMinimum);
    event UnbondingPeriodUpdated(uint256 unbondingPeriod);
    event TreasuryUpdated(address treasury);

    error ZeroAddress();
    error ZeroAmount();
    error ZeroComputeUnits();
    error ProviderAlreadyRegistered(address provider);
    error ProviderNotRegistered(address provider);
    error ProviderIsBlacklisted(address provider);
    error ProviderHasNodes(address provider, uint256 nodeCount);
    error InsufficientStake(uint256 required, uint256 available);
    error NodeAlreadyRegistered(address node);
    error NodeNotFound(address node);
    error NotNodeProvider(address node, address caller);
    error NodeInPool(address node, uint256 poolId);
    error InvalidNodeSignature(address node, address signer);
    error NothingToClaim(address provider);
    error SlashExceedsStake(address provider, uint256 amount, uint256 available);

    constructor(address admin, IERC20 token_, uint256 stakeMinimum_) {
        if (admin == address(0) || address(token_) == address(0)) revert ZeroAddress();
        token = token_;
        stakeMinimum = stakeMinimum_;
        treasury = admin;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(FEDERATOR_ROLE, admin);
    }

    // ---- providers ----

    function registerProvider(uint256 stake) external {
        Provider storage p = _providers[msg.sender];
        if (p.blacklisted) revert ProviderIsBlacklisted(msg.sender);
        if (p.registered) revert ProviderAlreadyRegistered(msg.sender);
        if (stake < stakeMinimum || stake == 0) revert InsufficientStake(_max(stakeMinimum, 1), stake);
        p.registered = true;
        p.stake = stake;
        p.registeredAt = uint64(block.timestamp);
        token.safeTransferFrom(msg.sender, address(this), stake);
        emit ProviderRegistered(msg.sender, stake);
    }

    function increaseStake(uint256 amount) external {
        Provider storage p = _registered(msg.sender);
        if (amount == 0) revert ZeroAmount();
        p.stake += amount;
        token.safeTransferFrom(msg.sender, address(this), amount);
        emit StakeIncreased(msg.sender, amount, p.stake);
    }

    /// @notice Move `amount` of stake into a 7-day unbonding; what remains must still cover the nodes.
    function startUnbonding(uint256 amount) external {
        Provider storage p = _registered(msg.sender);
        if (amount == 0) revert ZeroAmount();
        if (amount > p.stake) revert InsufficientStake(amount, p.stake);
        uint256 required = requiredStake(msg.sender, 0);
        if (p.stake - amount < required) revert InsufficientStake(required, p.stake - amount);
        p.stake -= amount;
        _queueUnbond(msg.sender, amount);
    }

    /// @notice Leave the registry: all stake starts unbonding. Remove every node first.
    function deregisterProvider() external {
        Provider storage p = _registered(msg.sender);
        if (p.nodeCount != 0) revert ProviderHasNodes(msg.sender, p.nodeCount);
        uint256 amount = p.stake;
        p.stake = 0;
        p.registered = false;
        if (amount > 0) _queueUnbond(msg.sender, amount);
        emit ProviderDeregistered(msg.sender, amount);
    }

    function claimUnbonded() external returns (uint256 amount) {
        Unbond[] storage list = _unbonds[msg.sender];
        // Order of pending unbonds does not matter, so removing by swap-and-pop is safe here.
        for (uint256 i = list.length; i > 0; i--) {
            if (list[i - 1].releaseAt <= block.timestamp) {
                amount += list[i - 1].amount;
                list[i - 1] = list[list.length - 1];
                list.pop();
            }
        }
        if (amount == 0) revert NothingToClaim(msg.sender);
        token.safeTransfer(msg.sender, amount);
        emit UnbondedClaimed(msg.sender, amount);
    }

    // ---- nodes ----

    /// @notice Add a node; `signature` is the node key's EIP-191 signature over keccak256(provider ‖ node).
    function addNode(address node, uint256 computeUnits, bytes calldata signature) external {
        Provider storage p = _registered(msg.sender);
        if (p.blacklisted) revert ProviderIsBlacklisted(msg.sender);
        if (node == address(0)) revert ZeroAddress();
        if (computeUnits == 0) revert ZeroComputeUnits();
        if (_nodes[node].provider != address(0)) revert NodeAlreadyRegistered(node);
        bytes32 digest = MessageHashUtils.toEthSignedMessageHash(keccak256(abi.encodePacked(msg.sender, node)));
        (address signer,,) = ECDSA.tryRecover(digest, signature);
        if (signer != node) revert InvalidNodeSignature(node, signer);
        uint256 required = requiredStake(msg.sender, computeUnits);
        if (p.stake < required) revert InsufficientStake(required, p.stake);
        _nodes[node] = Node(msg.sender, computeUnits, false, 0, uint64(block.timestamp));
        _providerNodes[msg.sender].add(node);
        p.totalComputeUnits += computeUnits;
        p.nodeCount += 1;
        emit NodeAdded(msg.sender, node, computeUnits);
    }

    function removeNode(address node) external {
        Node storage n = _nodes[node];
        if (n.provider == address(0)) revert NodeNotFound(node);
        if (n.provider != msg.sender) revert NotNodeProvider(node, msg.sender);
        if (n.activePool != 0) revert NodeInPool(node, n.activePool);
        Provider storage p = _providers[msg.sender];
        p.totalComputeUnits -= n.computeUnits;
        p.nodeCount -= 1;
        _providerNodes[msg.sender].remove(node);
        delete _nodes[node];
        emit NodeRemoved(msg.sender, node);
    }

    function setNodeValidated(address node, bool status) external onlyRole(VALIDATOR_ROLE) {
        if (_nodes[node].provider == address(0)) revert NodeNotFound(node);
        _nodes[node].validated = status;
        emit NodeValidated(node, status);
    }

    // ---- federator ----

    function setProviderWhitelisted(address provider, bool status) external onlyRole(FEDERATOR_ROLE) {
        if (provider == address(0)) revert ZeroAddress();
        _providers[provider].whitelisted = status;
        emit ProviderWhitelisted(provider, status);
    }

    function setProviderBlacklisted(address provider, bool status) external onlyRole(FEDERATOR_ROLE) {
        if (provider == address(0)) revert ZeroAddress();
        _providers[provider].blacklisted = status;
        emit ProviderBlacklisted(provider, status);
    }

    // ---- pool hooks ----

    function setNodePool(address node, uint256 poolId) external onlyRole(POOL_ROLE) {
        if (_nodes[node].provider == address(0)) revert NodeNotFound(node);
        _nodes[node].activePool = poolId;
        emit NodePoolChanged(node, poolId);
    }

    /// @notice The node leaves its pool; its compute units, for the pool's total. One call (and the
    /// two storage reads it needs) on the pool's leave, eject and invalidation paths.
    function clearNodePool(address node) external onlyRole(POOL_ROLE) returns (uint256 computeUnits) {
        Node storage n = _nodes[node];
        if (n.provider == address(0)) revert NodeNotFound(node);
        n.activePool = 0;
        emit NodePoolChanged(node, 0);
        return n.computeUnits;
    }

    /// @notice Take `amount` from the provider, unbonding stake first, and send it to the treasury.
    function slash(address provider, uint256 amount) external onlyRole(POOL_ROLE) {
        if (amount == 0) revert ZeroAmount();
        uint256 available = slashableBalance(provider);
        if (amount > available) revert SlashExceedsStake(provider, amount, available);
        _slash(provider, amount);
    }

    /// @notice Slash at most `amount`, capped at what the provider has (nothing when it has nothing):
    /// one call for the pool's invalidation path, which must never fail for lack of stake.
    function slashUpTo(address provider, uint256 amount) external onlyRole(POOL_ROLE) returns (uint256 slashed) {
        slashed = slashableBalance(provider);
        if (slashed > amount) slashed = amount;
        if (slashed > 0) _slash(provider, slashed);
    }

    function _slash(address provider, uint256 amount) private {
        uint256 left = amount;
        Unbond[] storage list = _unbonds[provider];
        for (uint256 i = list.length; i > 0 && left > 0; i--) {
            uint256 take = list[i - 1].amount < left ? list[i - 1].amount : left;
            list[i - 1].amount -= take;
            left -= take;
            if (list[i - 1].amount == 0) {
                list[i - 1] = list[list.length - 1];
                list.pop();
            }
        }
        _providers[provider].stake -= left;
        token.safeTransfer(treasury, amount);
        emit ProviderSlashed(provider, amount, msg.sender);
    }

    // ---- admin ----

    function setStakeMinimum(uint256 value) external onlyRole(DEFAULT_ADMIN_ROLE) {
        stakeMinimum = value;
        emit StakeMinimumUpdated(value);
    }

    function setUnbondingPeriod(uint256 value) external onlyRole(DEFAULT_ADMIN_ROLE) {
        unbondingPeriod = value;
        emit UnbondingPeriodUpdated(value);
    }

    function setTreasury(address value) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (value == address(0)) revert ZeroAddress();
        treasury = value;
        emit TreasuryUpdated(value);
    }

    // ---- views ----

    function getProvider(address provider) external view returns (Provider memory) {
        return _providers[provider];
    }

    function getNode(address node) external view returns (Node memory) {
        if (_nodes[node].provider == address(0)) revert NodeNotFound(node);
        return _nodes[node];
    }

    /// @notice A node's provider in one storage read (`getNode` reads all five of the node's slots).
    function providerOf(address node) external view returns (address provider) {
        provider = _nodes[node].provider;
        if (provider == address(0)) revert NodeNotFound(node);
    }

    function nodeExists(address node) external view returns (bool) {
        return _nodes[node].provider != address(0);
    }

    function getProviderNodes(address provider) external view returns (address[] memory) {
        return _providerNodes[provider].values();
    }

    function getUnbonds(address provider) external view returns (Unbond[] memory) {
        return _unbonds[provider];
    }

    /// @notice Stake needed to hold the provider's current nodes plus `newUnits` more.
    function requiredStake(address provider, uint256 newUnits) public view returns (uint256) {
        return (_providers[provider].totalComputeUnits + newUnits + 1) * stakeMinimum;
    }

    function slashableBalance(address provider) public view returns (uint256 total) {
        total = _providers[provider].stake;
        Unbond[] storage list = _unbonds[provider];
        for (uint256 i = 0; i < list.length; i++) total += list[i].amount;
    }

    // ---- internal ----

    function _registered(address provider) private view returns (Provider storage p) {
        p = _providers[provider];
        if (!p.registered) revert ProviderNotRegistered(provider);
    }

    function _queueUnbond(address provider, uint256 amount) private {
        uint256 releaseAt = block.timestamp + unbondingPeriod;
        _unbonds[provider].push(Unbond(amount, uint64(releaseAt)));
        emit UnbondingStarted(provider, amount, releaseAt);
    }

    function _max(uint256 a, uint256 b) private pure returns (uint256) {
        return a > b ? a : b;
    }
}
