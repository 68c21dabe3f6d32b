// SPDX-License-Identifier: MIT
pragma solidity ^0.8.37;

/// @title PaymentLedger
/// @notice Append-only, at-most-once record of Paygate payments. Storage keeps only a
///         digest of each entry plus its amount, depth and timestamp; the strings travel
///         in the PaymentRecorded event. No full URL is ever stored: `origin` is
///         scheme://host[:port] (checked here) and `pathHash` is the keccak256 of the path
///         (computed by the caller).
contract PaymentLedger {
    /// @notice What is stored per id (two storage slots).
    /// @dev digest = keccak256(abi.encode(id, parentTxHash, keccak256(agentId), amount,
    ///      keccak256(protocol), keccak256(origin), pathHash, depth)), see digestOf.
    struct Entry {
        bytes32 digest;
        uint128 amount;
        uint64 timestamp;
        uint32 depth;
    }

    address public owner;
    uint256 public count;
    mapping(address account => bool) public isRecorder;
    mapping(bytes32 id => Entry) private _entries;

    event PaymentRecorded(
        bytes32 indexed id,
        bytes32 indexed parentTxHash,
        bytes32 indexed agentIdHash,
        string agentId,
        uint256 amount,
        string protocol,
        string origin,
        bytes32 pathHash,
        uint32 depth,
        uint64 timestamp
    );
    event RecorderSet(address indexed recorder, bool allowed);
    event OwnershipTransferred(address indexed previousOwner, address indexed newOwner);

    error NotOwner();
    error NotRecorder();
    error ZeroAddress();
    error ZeroId();
    error AlreadyRecorded(bytes32 id);
    error AmountTooLarge();
    error OriginNotBare();

    constructor() {
        owner = msg.sender;
        isRecorder[msg.sender] = true;
        emit OwnershipTransferred(address(0), msg.sender);
        emit RecorderSet(msg.sender, true);
    }

    modifier onlyOwner() {
        if (msg.sender != owner) revert NotOwner();
        _;
    }

    function transferOwnership(address newOwner) external onlyOwner {
        if (newOwner == address(0)) revert ZeroAddress();
        emit OwnershipTransferred(owner, newOwner);
        owner = newOwner;
    }

    function addRecorder(address recorder) external onlyOwner {
        if (recorder == address(0)) revert ZeroAddress();
        isRecorder[recorder] = true;
        emit RecorderSet(recorder, true);
    }

    function removeRecorder(address recorder) external onlyOwner {
        isRecorder[recorder] = false;
        emit RecorderSet(recorder, false);
    }

    /// @notice Records one payment (or an invocation root: depth 0, protocol "", amount
    ///         possibly 0). Reverts AlreadyRecorded for a known id.
    function record(
        bytes32 id,
        bytes32 parentTxHash,
        string calldata agentId,
        uint256 amount,
        string calldata protocol,
        string calldata origin,
        bytes32 pathHash,
        uint32 depth
    ) external {
        if (!isRecorder[msg.sender]) revert NotRecorder();
        if (id == bytes32(0)) revert ZeroId();
        if (amount > type(uint128).max) revert AmountTooLarge();
        Entry storage entry = _entries[id];
        if (entry.digest != bytes32(0)) revert AlreadyRecorded(id);
        _requireBareOrigin(origin);

        bytes32 agentIdHash = keccak256(bytes(agentId));
        entry.digest = _digest(id, parentTxHash, agentIdHash, amount, protocol, origin, pathHash, depth);
        uint64 timestamp = uint64(block.timestamp);
        entry.amount = uint128(amount);
        entry.timestamp = timestamp;
        entry.depth = depth;
        unchecked {
            ++count;
        }
        emit PaymentRecorded(
            id, parentTxHash, agentIdHash, agentId, amount, protocol, origin, pathHash, depth, timestamp
        );
    }

    function recorded(bytes32 id) external view returns (bool) {
        return _entries[id].digest != bytes32(0);
    }

    /// @notice The stored entry; all zero for an unknown id.
    function entryOf(bytes32 id) external view returns (Entry memory) {
        return _entries[id];
    }

    /// @notice The digest record() stores for these fields, to check an event against storage.
    function digestOf(
        bytes32 id,
        bytes32 parentTxHash,
        string calldata agentId,
        uint256 amount,
        string calldata protocol,
        string calldata origin,
        bytes32 pathHash,
        uint32 depth
    ) external pure returns (bytes32) {
        return _digest(id, parentTxHash, keccak256(bytes(agentId)), amount, protocol, origin, pathHash, depth);
    }

    function _digest(
        bytes32 id,
        bytes32 parentTxHash,
        bytes32 agentIdHash,
        uint256 amount,
        string calldata protocol,
        string calldata origin,
        bytes32 pathHash,
        uint32 depth
    ) private pure returns (bytes32) {
        return keccak256(
            abi.encode(
                id,
                parentTxHash,
                agentIdHash,
                amount,
                keccak256(bytes(protocol)),
                keccak256(bytes(origin)),
                pathHash,
                depth
            )
        );
    }

    /// @dev Rejects anything that is more than scheme://host[:port]: a '/' other than the
    ///      "//" right after the first ':', and any '?', '#', at sign (userinfo), space,
    ///      control or non-ASCII byte. The empty string (invocation roots) is allowed.
    function _requireBareOrigin(string calldata origin) private pure {
        uint256 length = bytes(origin).length;
        uint256 offset;
        assembly ("memory-safe") {
            offset := origin.offset
        }
        uint256 slashes; // how many of the two "//" slashes were seen
        uint256 prev; // previous byte
        for (uint256 i; i < length; ) {
            uint256 c;
            assembly ("memory-safe") {
                c := byte(0, calldataload(add(offset, i)))
            }
            if (c == 0x2f) {
                // '/': only "scheme:" "/" "/"
                if (slashes == 0 ? prev != 0x3a : (slashes == 1 ? prev != 0x2f : true)) revert OriginNotBare();
                ++slashes;
            } else if (c <= 0x20 || c == 0x3f || c == 0x23 || c == 0x40 || c >= 0x7f) {
                revert OriginNotBare();
            }
            prev = c;
            unchecked {
                ++i;
            }
        }
    }
}
